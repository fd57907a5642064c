// Next-edit suggestions in VS Code: once an edit settles, the server is asked where the
// same change is due (fimls/nextEdits). The nearest place is decorated (the old text struck
// through, the new one after it). Tab (where no inline suggestion shows) or Alt+N jumps
// there; pressed again on that line it applies the change, and the next place is shown.
// Escape ends the chain, and the server forgets the edit.
'use strict';
const vscode = require('vscode');

const SETTLE_MS = 300;
const CONTEXT_KEY = 'fimls.nextEditVisible';

let getClient = () => undefined;
let out; // the output channel
let shown = null; // { uri, edit, range } of the decorated place
let timer;
let asked = 0; // the newest ask: older answers are stale
let decoration;

function setShown(value) {
  shown = value;
  vscode.commands.executeCommand('setContext', CONTEXT_KEY, !!value);
}

function clear() {
  for (const editor of vscode.window.visibleTextEditors) editor.setDecorations(decoration, []);
  setShown(null);
}

function show(editor, edit, range) {
  editor.setDecorations(decoration, [{
    range,
    renderOptions: { after: { contentText: ` → ${edit.newText}` } },
    hoverMessage: `fimls: next edit (confidence ${edit.confidence}); Tab or Alt+N`,
  }]);
  setShown({ uri: editor.document.uri.toString(), edit, range });
}

async function ask(editor) {
  const client = getClient();
  if (!client || !editor || !client.isRunning()) return;
  const mine = ++asked;
  const version = editor.document.version;
  const c2p = client.code2ProtocolConverter;
  let result;
  try {
    result = await client.sendRequest('fimls/nextEdits', {
      textDocument: c2p.asTextDocumentIdentifier(editor.document),
      position: c2p.asPosition(editor.selection.active),
    });
  } catch (e) {
    out.warn(`fimls/nextEdits failed: ${e}`);
    return;
  }
  out.debug(`fimls/nextEdits: ${(result && result.edits || []).length} edits`);
  if (mine !== asked || editor.document.version !== version) return;
  const uri = editor.document.uri.toString();
  const edit = (result && result.edits || []).find((e) => e.textDocument.uri === uri);
  if (!edit) {
    clear();
    return;
  }
  show(editor, edit, client.protocol2CodeConverter.asRange(edit.range));
}

// Tab / Alt+N: jump to the place, or apply the change when the cursor is on its line.
async function go() {
  const editor = vscode.window.activeTextEditor;
  if (!editor || !shown || shown.uri !== editor.document.uri.toString()) return;
  const { edit, range } = shown;
  if (editor.selection.active.line !== range.start.line) {
    editor.selection = new vscode.Selection(range.start, range.start);
    editor.revealRange(range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    return;
  }
  clear();
  // The change is an edit like any other: once it settles, the next place is asked for.
  await editor.edit((b) => b.replace(range, edit.newText));
}

function dismiss() {
  const editor = vscode.window.activeTextEditor;
  const client = getClient();
  clear();
  if (editor && client && client.isRunning()) {
    client.sendNotification('fimls/dismissNextEdits', {
      textDocument: { uri: editor.document.uri.toString() },
    });
  }
}

exports.activate = function activate(context, clientGetter, enabled, output) {
  getClient = clientGetter;
  out = output;
  decoration = vscode.window.createTextEditorDecorationType({
    textDecoration: 'line-through',
    backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
    after: { color: new vscode.ThemeColor('editorGhostText.foreground'), fontStyle: 'italic' },
  });
  context.subscriptions.push(
    decoration,
    vscode.commands.registerCommand('fimls.nextEdit', go),
    vscode.commands.registerCommand('fimls.dismissNextEdit', dismiss),
    vscode.workspace.onDidChangeTextDocument((e) => {
      const editor = vscode.window.activeTextEditor;
      if (!editor || e.document !== editor.document || !e.contentChanges.length) return;
      out.debug(`change in ${e.document.uri}: asking for next edits`);
      clear();
      clearTimeout(timer);
      if (!enabled(editor.document)) return;
      timer = setTimeout(() => ask(editor), SETTLE_MS);
    }),
    vscode.window.onDidChangeActiveTextEditor(() => clear()));
};
