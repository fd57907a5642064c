// fimls for VS Code: starts `fimls serve` over stdio with vscode-languageclient 11 (inline
// completion is built in there), passes the settings as initializationOptions and on
// change (workspace/didChangeConfiguration), shows the last request's latency and the
// acceptance rate in the status bar, and tells the server which suggestions were shown
// (fimls/didShowCompletion); accepting runs the item's command, which the server logs.
// Where the cursor rests (a file opened at a line, a click, a jump) goes to the server as
// fimls/cursor, so it evaluates the prompt there while the user reads.
// Switches: fimls.enable per language ("*" plus overrides), a global toggle and a snooze
// (status-bar click or commands); a disabled or snoozed editor sends no request at all. In
// manual mode (fimls.triggerMode) only an explicit trigger (Alt+\\, Trigger Inline
// Suggestion) asks. Next edits (nextedit.js): after an edit, where the same change is due.
'use strict';
const vscode = require('vscode');
const os = require('os');
const path = require('path');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');
const nextEdit = require('./nextedit');

let client;
let status;
let extensionContext;
const stats = { shown: 0, accepted: 0, lastMs: null };
// The extension's own settings; every other fimls.* setting is a server option.
const CLIENT_KEYS = new Set(['serverCommand', 'enable']);
const INVOKE = 0; // vscode.InlineCompletionTriggerKind.Invoke

// The server options the user set (settings.json, any scope): the server keeps its own
// defaults for the rest. package.json's settings are generated from the server's options.
function settings() {
  const c = vscode.workspace.getConfiguration('fimls');
  const props = extensionContext.extension.packageJSON.contributes.configuration.properties;
  const opts = {};
  for (const full of Object.keys(props)) {
    const key = full.slice('fimls.'.length);
    if (CLIENT_KEYS.has(key)) continue;
    const seen = c.inspect(key);
    const set = seen && [seen.workspaceFolderValue, seen.workspaceValue, seen.globalValue]
      .find((v) => v !== undefined);
    if (set !== undefined) opts[key] = set;
  }
  return opts;
}

// On, off (the toggle) or snoozed until a time; kept across restarts of the editor.
function snoozedUntil() {
  return extensionContext.globalState.get('fimls.snoozedUntil', 0);
}

function globallyOn() {
  return extensionContext.globalState.get('fimls.on', true) && Date.now() >= snoozedUntil();
}

function languageOn(languageId) {
  const table = vscode.workspace.getConfiguration('fimls').get('enable') || {};
  if (Object.prototype.hasOwnProperty.call(table, languageId)) return !!table[languageId];
  return table['*'] !== false;
}

function manualOnly() {
  return vscode.workspace.getConfiguration('fimls').get('triggerMode') === 'manual';
}

function asks(document, ctx) {
  if (!globallyOn() || !languageOn(document.languageId)) return false;
  return !manualOnly() || ctx.triggerKind === INVOKE;
}

function latencyLogPath() {
  const p = vscode.workspace.getConfiguration('fimls').get('latencyLog');
  if (p) return p;
  const state = process.env.XDG_STATE_HOME || path.join(os.homedir(), '.local', 'state');
  return path.join(state, 'fimls', 'latency.jsonl');
}

function render() {
  if (!status) return;
  const ms = stats.lastMs === null ? '–' : `${Math.round(stats.lastMs)} ms`;
  const rate = stats.shown ? `${Math.round((100 * stats.accepted) / stats.shown)}%` : '–';
  const editor = vscode.window.activeTextEditor;
  let state = '';
  if (!extensionContext.globalState.get('fimls.on', true)) state = ' (off)';
  else if (Date.now() < snoozedUntil()) state = ' (snoozed)';
  else if (editor && !languageOn(editor.document.languageId)) state = ` (off for ${editor.document.languageId})`;
  status.text = `$(${state ? 'circle-slash' : 'sparkle'}) fimls${state} ${ms} · ${rate} accepted`;
  status.tooltip = `fimls: last suggestion ${ms}; accepted ${stats.accepted} of ${stats.shown} shown; click for switches`;
}

async function setOn(on) {
  await extensionContext.globalState.update('fimls.on', on);
  await extensionContext.globalState.update('fimls.snoozedUntil', 0);
  render();
}

async function snooze(minutes) {
  await extensionContext.globalState.update('fimls.snoozedUntil', Date.now() + minutes * 60000);
  setTimeout(render, minutes * 60000 + 100);
  render();
}

async function toggleLanguage(languageId) {
  const c = vscode.workspace.getConfiguration('fimls');
  const table = { ...(c.get('enable') || {}) };
  table[languageId] = !languageOn(languageId);
  await c.update('enable', table, vscode.ConfigurationTarget.Global);
  render();
}

async function statusMenu() {
  const editor = vscode.window.activeTextEditor;
  const lang = editor && editor.document.languageId;
  const on = extensionContext.globalState.get('fimls.on', true);
  const picks = [
    { label: on ? 'Turn fimls off' : 'Turn fimls on', run: () => setOn(!on) },
    { label: 'Snooze for 15 minutes', run: () => snooze(15) },
    { label: 'Snooze for 60 minutes', run: () => snooze(60) },
  ];
  if (lang) picks.push({ label: `${languageOn(lang) ? 'Disable' : 'Enable'} for ${lang}`, run: () => toggleLanguage(lang) });
  picks.push({ label: 'Open latency log', run: () => vscode.commands.executeCommand('fimls.openLatencyLog') });
  const pick = await vscode.window.showQuickPick(picks, { placeHolder: 'fimls' });
  if (pick) await pick.run();
}

function makeClient(context, out) {
  const cmd = vscode.workspace.getConfiguration('fimls').get('serverCommand') || ['fimls', 'serve'];
  const serverOptions = { command: cmd[0], args: cmd.slice(1), transport: TransportKind.stdio };
  const clientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: settings(),
    outputChannel: out,
    synchronize: { configurationSection: 'fimls' },
    middleware: {
      provideInlineCompletionItems: async (document, position, ctx, token, next) => {
        if (!asks(document, ctx)) return null;
        const t0 = Date.now();
        const result = await next(document, position, ctx, token);
        const items = Array.isArray(result) ? result : (result && result.items) || [];
        if (items.length && !token.isCancellationRequested) {
          stats.lastMs = Date.now() - t0;
          stats.shown += 1;
          const cmd = items[0].command;
          const requestId = cmd && cmd.arguments && cmd.arguments[0];
          if (requestId && client) client.sendNotification('fimls/didShowCompletion', { requestId });
          render();
        }
        return result;
      },
      // VS Code runs the item's command when the user accepts a suggestion; the server
      // logs it, and the status bar counts it.
      executeCommand: async (command, args, next) => {
        if (command === 'fimls.acceptCompletion') {
          stats.accepted += 1;
          render();
        }
        return next(command, args);
      },
    },
  };
  return new LanguageClient('fimls', 'fimls', serverOptions, clientOptions);
}

// Sent once the cursor has rested this long: moving through a file sends nothing.
const CURSOR_REST_MS = 250;
let cursorTimer;

function reportCursor(editor) {
  clearTimeout(cursorTimer);
  if (!editor || !client) return;
  cursorTimer = setTimeout(() => {
    if (!client || !client.isRunning()) return;
    const c2p = client.code2ProtocolConverter;
    client.sendNotification('fimls/cursor', {
      textDocument: c2p.asTextDocumentIdentifier(editor.document),
      position: c2p.asPosition(editor.selection.active),
    });
  }, CURSOR_REST_MS);
}

exports.activate = async function activate(context) {
  extensionContext = context;
  const out = vscode.window.createOutputChannel('fimls', { log: true });
  status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.command = 'fimls.statusMenu';
  render();
  status.show();
  context.subscriptions.push(status, out);
  client = makeClient(context, out);
  context.subscriptions.push(vscode.commands.registerCommand('fimls.restartServer', async () => {
    if (client) await client.stop();
    client = makeClient(context, out);
    await client.start();
    out.info('fimls server restarted');
  }));
  context.subscriptions.push(
    vscode.commands.registerCommand('fimls.statusMenu', statusMenu),
    vscode.commands.registerCommand('fimls.toggle', () => setOn(!extensionContext.globalState.get('fimls.on', true))),
    vscode.commands.registerCommand('fimls.snooze', async () => {
      const m = await vscode.window.showInputBox({ prompt: 'Snooze fimls for how many minutes?', value: '30' });
      if (m && Number(m) > 0) await snooze(Number(m));
    }),
    vscode.commands.registerCommand('fimls.toggleLanguage', () => {
      const editor = vscode.window.activeTextEditor;
      if (editor) return toggleLanguage(editor.document.languageId);
      return undefined;
    }),
    vscode.workspace.onDidChangeConfiguration((e) => { if (e.affectsConfiguration('fimls')) render(); }),
    vscode.window.onDidChangeActiveTextEditor(() => render()));
  context.subscriptions.push(vscode.commands.registerCommand('fimls.openLatencyLog', async () => {
    const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(latencyLogPath()));
    await vscode.window.showTextDocument(doc, { preview: true });
  }));
  context.subscriptions.push(
    vscode.window.onDidChangeTextEditorSelection((e) => reportCursor(e.textEditor)),
    vscode.window.onDidChangeActiveTextEditor((e) => reportCursor(e)));
  nextEdit.activate(context, () => client, (doc) => globallyOn() && languageOn(doc.languageId),
    out);
  await client.start();
  reportCursor(vscode.window.activeTextEditor);
  out.info('fimls started: inlineCompletionProvider=' +
    JSON.stringify(client.initializeResult && client.initializeResult.capabilities.inlineCompletionProvider));
};

exports.deactivate = function deactivate() {
  return client ? client.stop() : undefined;
};
