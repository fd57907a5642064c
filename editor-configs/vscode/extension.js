// fimls for VS Code: starts `fimls serve` over stdio with vscode-languageclient 11 (inline
// completion is built in there), passes the settings as initializationOptions and on
// change (workspace/didChangeConfiguration), shows the last request's latency and the
// acceptance rate in the status bar, and tells the server which suggestions were shown
// (fimls/didShowCompletion); accepting runs the item's command, which the server logs.
// Where the cursor rests (a file opened at a line, a click, a jump) goes to the server as
// fimls/cursor, so it evaluates the prompt there while the user reads.
'use strict';
const vscode = require('vscode');
const os = require('os');
const path = require('path');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');

let client;
let status;
const stats = { shown: 0, accepted: 0, lastMs: null };

function settings() {
  const c = vscode.workspace.getConfiguration('fimls');
  const opts = {
    model: c.get('model') || null,
    draftModel: c.get('draftModel') || null,
    speculative: c.get('speculative'),
    maxTokens: c.get('maxTokens'),
    latencyLog: c.get('latencyLog') || null,
  };
  return opts;
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
  status.text = `$(sparkle) fimls ${ms} · ${rate} accepted`;
  status.tooltip = `fimls: last suggestion ${ms}; accepted ${stats.accepted} of ${stats.shown} shown`;
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
  const out = vscode.window.createOutputChannel('fimls', { log: true });
  status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.command = 'fimls.openLatencyLog';
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
  context.subscriptions.push(vscode.commands.registerCommand('fimls.openLatencyLog', async () => {
    const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(latencyLogPath()));
    await vscode.window.showTextDocument(doc, { preview: true });
  }));
  context.subscriptions.push(
    vscode.window.onDidChangeTextEditorSelection((e) => reportCursor(e.textEditor)),
    vscode.window.onDidChangeActiveTextEditor((e) => reportCursor(e)));
  await client.start();
  reportCursor(vscode.window.activeTextEditor);
  out.info('fimls started: inlineCompletionProvider=' +
    JSON.stringify(client.initializeResult && client.initializeResult.capabilities.inlineCompletionProvider));
};

exports.deactivate = function deactivate() {
  return client ? client.stop() : undefined;
};
