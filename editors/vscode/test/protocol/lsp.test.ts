// Drives the real `kspec lsp` over stdio with vscode-languageserver-protocol (the
// library vscode-languageclient itself sits on), with the settings object our
// extension would send and the server command our discovery code finds.
//
// Needs: a kspec in the repository's .venv (or KSPEC_LSP_COMMAND), and a model:
// KSPEC_TEST_MODEL, or a tiny random one written with the environment's Python.

import assert from 'node:assert/strict';
import { ChildProcess, execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { pathToFileURL } from 'node:url';
import {
	CompletionRequest,
	ConfigurationRequest,
	createProtocolConnection,
	DidChangeConfigurationNotification,
	DidChangeTextDocumentNotification,
	DidOpenTextDocumentNotification,
	ExitNotification,
	InitializedNotification,
	InitializeRequest,
	InlineCompletionItem,
	InlineCompletionList,
	InlineCompletionRequest,
	InlineCompletionTriggerKind,
	LogMessageNotification,
	Position,
	ProtocolConnection,
	ShutdownRequest,
	StreamMessageReader,
	StreamMessageWriter,
	TextDocumentSyncKind,
} from 'vscode-languageserver-protocol/node';
import { defaultIsExecutable, resolveServerCommand } from '../../src/serverCommand';
import { ConfigSource, readSettings, toServerSettings } from '../../src/settings';
import { parseStatus, STATUS_METHOD, StatusModel, StatusParams } from '../../src/status';

const repoRoot = path.resolve(__dirname, '..', '..', '..', '..', '..');
const K = 3;

function waitFor<T>(what: string, poll: () => T | undefined, timeoutMs: number, wake: { on: (f: () => void) => void }): Promise<T> {
	// Resolves when poll() returns something, re-checking on every server message; rejects at the deadline.
	return new Promise((resolve, reject) => {
		const check = () => {
			const v = poll();
			if (v !== undefined) {
				clearTimeout(timer);
				resolve(v);
				return true;
			}
			return false;
		};
		const timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)), timeoutMs);
		if (!check()) {
			wake.on(check);
		}
	});
}

function items(result: InlineCompletionItem[] | InlineCompletionList | null): InlineCompletionItem[] {
	if (result === null) {
		return [];
	}
	return Array.isArray(result) ? result : result.items;
}

function positionLE(a: Position, b: Position): boolean {
	return a.line < b.line || (a.line === b.line && a.character <= b.character);
}

describe('kspec lsp over stdio', { timeout: 180_000 }, () => {
	let proc: ChildProcess;
	let conn: ProtocolConnection;
	let tmp: string;
	let stderr = '';
	const statuses: StatusParams[] = [];
	const logs: string[] = [];
	const listeners: (() => boolean)[] = [];
	const wake = {
		on: (f: () => boolean | void) => { listeners.push(() => f() === true); },
	};
	const poke = () => {
		for (let i = listeners.length - 1; i >= 0; i--) {
			if (listeners[i]()) {
				listeners.splice(i, 1);
			}
		}
	};
	let settingsSent: Record<string, unknown>;
	const status = new StatusModel();
	const docUri = () => pathToFileURL(path.join(tmp, 'example.py')).toString();

	before(async () => {
		tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kspec-protocol-'));
		// The server command, found the way the extension finds it (workspace = the repository).
		let command: string;
		let args: string[];
		if (process.env.KSPEC_LSP_COMMAND) {
			[command, ...args] = JSON.parse(process.env.KSPEC_LSP_COMMAND) as string[];
		} else {
			const found = resolveServerCommand(readSettings({ get: () => undefined }).settings, {
				platform: process.platform, env: { PATH: process.env.PATH }, home: os.homedir(),
				workspaceFolders: [repoRoot], isExecutable: defaultIsExecutable,
			});
			assert.ok(found.ok, found.ok ? '' : found.error);
			assert.equal(found.value.source, `workspace environment ${path.join(repoRoot, '.venv')}`);
			command = found.value.command;
			args = found.value.args;
		}
		let model = process.env.KSPEC_TEST_MODEL;
		if (!model) {
			model = path.join(tmp, 'model');
			const python = path.join(path.dirname(command), process.platform === 'win32' ? 'python.exe' : 'python');
			execFileSync(python, ['-c',
				'import sys; from pathlib import Path; from model_factory import write_random_model; write_random_model(Path(sys.argv[1]), "llama")',
				model], { cwd: repoRoot, stdio: ['ignore', 'ignore', 'inherit'] });
		}
		// The settings object the extension sends, from a settings.json-like source.
		const user: Record<string, unknown> = { model, k: K, maxTokens: 8, debounceMs: 0, deadlineMs: 60000 };
		const source: ConfigSource = { get: <T>(key: string) => user[key] as T | undefined };
		settingsSent = { ...toServerSettings(readSettings(source, { home: os.homedir(), workspaceFolder: tmp }).settings) };
		if (process.env.KSPEC_TEST_ENGINE) {
			settingsSent.engine = process.env.KSPEC_TEST_ENGINE; // e.g. "inprocess": no shared daemon in tests
		}

		proc = spawn(command, args, { cwd: tmp, stdio: ['pipe', 'pipe', 'pipe'] });
		proc.stderr!.on('data', (chunk: Buffer) => { stderr += chunk.toString(); });
		conn = createProtocolConnection(new StreamMessageReader(proc.stdout!), new StreamMessageWriter(proc.stdin!));
		conn.onNotification(STATUS_METHOD, (raw: unknown) => {
			const s = parseStatus(raw);
			assert.ok(s, `malformed ${STATUS_METHOD}: ${JSON.stringify(raw)}`);
			statuses.push(s);
			status.onServerStatus(s);
			poke();
		});
		conn.onNotification(LogMessageNotification.type, (p) => { logs.push(p.message); });
		conn.onNotification('window/showMessage', (p: { message: string }) => { logs.push(p.message); });
		conn.onRequest(ConfigurationRequest.type, (p) => p.items.map((item) => (item.section === 'kspec' || !item.section ? settingsSent : null)));
		conn.onRequest('client/registerCapability', () => null);
		conn.onRequest('window/workDoneProgress/create', () => null);
		conn.listen();
	});

	after(async () => {
		conn?.dispose();
		if (proc && proc.exitCode === null) {
			proc.kill('SIGKILL');
		}
		if (tmp) {
			fs.rmSync(tmp, { recursive: true, force: true });
		}
	});

	const fail = (msg: string) => `${msg}\n--- server stderr (tail) ---\n${stderr.slice(-3000)}\n--- log ---\n${logs.slice(-20).join('\n')}`;

	it('initializes with inline completion and incremental sync', async () => {
		const result = await conn.sendRequest(InitializeRequest.type, {
			processId: process.pid,
			rootUri: pathToFileURL(tmp).toString(),
			workspaceFolders: [{ uri: pathToFileURL(tmp).toString(), name: 'tmp' }],
			initializationOptions: settingsSent,
			capabilities: {
				general: { positionEncodings: ['utf-16'] },
				workspace: { configuration: true, didChangeConfiguration: { dynamicRegistration: false } },
				textDocument: {
					synchronization: { dynamicRegistration: false },
					inlineCompletion: { dynamicRegistration: false },
					completion: { completionItem: { snippetSupport: false } },
				},
			},
		});
		const caps = result.capabilities;
		assert.ok(caps.inlineCompletionProvider, fail('no inlineCompletionProvider'));
		assert.ok(caps.completionProvider, fail('no completionProvider'));
		const sync = typeof caps.textDocumentSync === 'number' ? caps.textDocumentSync : caps.textDocumentSync?.change;
		assert.equal(sync, TextDocumentSyncKind.Incremental);
		assert.ok(caps.positionEncoding === undefined || caps.positionEncoding === 'utf-16', `positionEncoding ${caps.positionEncoding}`);
		await conn.sendNotification(InitializedNotification.type, {});
		status.setPhase('running'); // what the extension does on State.Running
	});

	it('reports the engine ready through $/kspec/status', async () => {
		await waitFor('a "ready" status', () => statuses.find((s) => s.state === 'ready'), 120_000, wake).catch((e) => {
			throw new Error(fail(`${e.message}; statuses: ${JSON.stringify(statuses)}`));
		});
		assert.ok(!statuses.some((s) => s.state === 'error'), fail(JSON.stringify(statuses)));
		assert.match(status.view().text, /^\$\(check\) kspec/);
	});

	it(`returns k = ${K} inline items after incremental edits, each continuing at the cursor`, async () => {
		// A comment: the random test model writes gibberish, which the server's syntax
		// checks rightly drop in code; in a comment all k alternatives survive.
		const uri = docUri();
		await conn.sendNotification(DidOpenTextDocumentNotification.type, {
			textDocument: { uri, languageId: 'python', version: 1, text: '\ndef add(a, b):\n    return a + b\n' },
		});
		// type "# " one character at a time at the start, as an editor does
		let version = 1;
		let character = 0;
		for (const ch of ['#', ' ']) {
			version += 1;
			await conn.sendNotification(DidChangeTextDocumentNotification.type, {
				textDocument: { uri, version },
				contentChanges: [{ range: { start: { line: 0, character }, end: { line: 0, character } }, text: ch }],
			});
			character += 1;
		}
		const position = { line: 0, character };
		const result = await conn.sendRequest(InlineCompletionRequest.type, {
			textDocument: { uri }, position, context: { triggerKind: InlineCompletionTriggerKind.Invoked },
		});
		const got = items(result);
		assert.equal(got.length, K, fail(`expected ${K} items, got ${JSON.stringify(got)}`));
		for (const item of got) {
			const text = typeof item.insertText === 'string' ? item.insertText : item.insertText.value;
			assert.ok(text.length > 0, 'empty insertText');
			if (item.range) {
				assert.ok(positionLE(item.range.start, position), `range starts after the cursor: ${JSON.stringify(item.range)}`);
				assert.ok(positionLE(position, item.range.end), `range ends before the cursor: ${JSON.stringify(item.range)}`);
			}
		}
		assert.equal(new Set(got.map((i) => JSON.stringify(i.insertText))).size, K, 'alternatives must differ');
		// the status bar's "ready, last latency"
		await waitFor('a ready status with a latency', () => statuses.find((s) => s.state === 'ready' && s.lastLatencyMs !== null), 10_000, wake)
			.catch((e) => { throw new Error(fail(`${e.message}; statuses: ${JSON.stringify(statuses)}`)); });
		assert.match(status.view().text, /^\$\(check\) kspec \d+(\.\d)? m?s$/);
	});

	it('counts positions in UTF-16 code units (a non-BMP character before the cursor)', async () => {
		const uri = pathToFileURL(path.join(tmp, 'emoji.py')).toString();
		const line = '# caf\u00e9 \u{1F600} '; // a comment: the random model's text is kept there
		await conn.sendNotification(DidOpenTextDocumentNotification.type, {
			textDocument: { uri, languageId: 'python', version: 1, text: line },
		});
		const position = { line: 0, character: line.length }; // JS length is UTF-16 units: 😀 counts 2
		const got = items(await conn.sendRequest(InlineCompletionRequest.type, {
			textDocument: { uri }, position, context: { triggerKind: InlineCompletionTriggerKind.Automatic },
		}));
		assert.ok(got.length >= 1, fail('no items at the end of a line with an emoji'));
		assert.ok(got.every((item) => item.range), 'kspec lsp gives every item a range');
		for (const item of got) {
			if (item.range) {
				assert.deepEqual(item.range.end, position, `range end ${JSON.stringify(item.range)} is not the UTF-16 cursor`);
			}
		}
	});

	it('applies workspace/didChangeConfiguration (k = 2, then enabled = false)', async () => {
		const uri = docUri();
		const position = { line: 0, character: 2 };
		await conn.sendNotification(DidChangeConfigurationNotification.type, { settings: { ...settingsSent, k: 2 } });
		const two = items(await conn.sendRequest(InlineCompletionRequest.type, {
			textDocument: { uri }, position, context: { triggerKind: InlineCompletionTriggerKind.Invoked },
		}));
		assert.equal(two.length, 2, fail(`k = 2 gave ${two.length} items`));
		await conn.sendNotification(DidChangeConfigurationNotification.type, { settings: { ...settingsSent, enabled: false } });
		const none = items(await conn.sendRequest(InlineCompletionRequest.type, {
			textDocument: { uri }, position, context: { triggerKind: InlineCompletionTriggerKind.Invoked },
		}));
		assert.equal(none.length, 0, fail('enabled = false still completes'));
		await conn.sendNotification(DidChangeConfigurationNotification.type, { settings: settingsSent });
	});

	it('answers textDocument/completion (the fallback for editors without inline completion)', async () => {
		const result = await conn.sendRequest(CompletionRequest.type, {
			textDocument: { uri: docUri() }, position: { line: 0, character: 2 },
		});
		const list = result === null ? [] : Array.isArray(result) ? result : result.items;
		assert.ok(list.length >= 1, fail('no completion items'));
	});

	it('shuts down and exits cleanly', async () => {
		await conn.sendRequest(ShutdownRequest.type);
		const exited = new Promise<string>((resolve) => {
			if (proc.exitCode !== null || proc.signalCode !== null) {
				resolve(`code ${proc.exitCode} signal ${proc.signalCode}`);
			} else {
				proc.once('exit', (code, signal) => resolve(`code ${code} signal ${signal}`));
			}
		});
		await conn.sendNotification(ExitNotification.type);
		const code = await Promise.race([exited, new Promise<string>((r) => setTimeout(() => r('timeout'), 10_000))]);
		assert.equal(code, 'code 0 signal null', fail(`exit: ${code}`));
	});
});
