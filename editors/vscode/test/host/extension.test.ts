// The real extension (src/extension.ts) with the real vscode-languageclient and the real
// `kspec lsp`, in a fake VS Code host (test/host/fakeVscode.ts): activation, server
// discovery and launch, the status bar fed by $/kspec/status, the inline completion
// provider the client registers (through our middleware) returning k items, the
// toggle command and the language filter, deactivation.
//
// Not covered (needs VS Code itself): rendering, Alt+] / Alt+[ cycling, Tab accepting.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import Module from 'node:module';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createFakeVscode, makeDocument, CancellationTokenSource, InlineCompletionTriggerKind, Position } from './fakeVscode';

const repoRoot = path.resolve(__dirname, '..', '..', '..', '..', '..');
const K = 3;

async function until<T>(what: string, poll: () => T | undefined | false, timeoutMs: number, context: () => string = () => ''): Promise<T> {
	const deadline = Date.now() + timeoutMs;
	for (;;) {
		const value = poll();
		if (value !== undefined && value !== false) {
			return value;
		}
		if (Date.now() > deadline) {
			throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}\n${context()}`);
		}
		await new Promise((resolve) => setTimeout(resolve, 20));
	}
}

describe('the extension in a fake VS Code host, against kspec lsp', { timeout: 180_000 }, () => {
	let tmp: string;
	let model: string;
	let fake: ReturnType<typeof createFakeVscode>;
	let extension: { activate(ctx: unknown): void; deactivate(): Promise<void> };
	const originalLoad = (Module as unknown as { _load: (...a: unknown[]) => unknown })._load;
	const context = () => `--- output channel ---\n${fake.log.slice(-30).join('\n')}\n--- error messages ---\n${fake.errors.join('\n')}`;
	const item = () => fake.statusItems[0];

	before(() => {
		tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kspec-host-'));
		model = process.env.KSPEC_TEST_MODEL ?? '';
		if (!model) {
			model = path.join(tmp, 'model');
			execFileSync(path.join(repoRoot, '.venv', 'bin', 'python'), ['-c',
				'import sys; from pathlib import Path; from model_factory import write_random_model; write_random_model(Path(sys.argv[1]), "llama")',
				model], { cwd: repoRoot, stdio: ['ignore', 'ignore', 'inherit'] });
		}
		const settings: Record<string, unknown> = {
			'kspec.model': model, 'kspec.k': K, 'kspec.maxTokens': 8, 'kspec.debounceMs': 0, 'kspec.deadlineMs': 60000,
			'kspec.server.args': ['lsp', '--engine', 'inprocess'],
		};
		if (process.env.KSPEC_LSP_COMMAND) {
			const [command, ...args] = JSON.parse(process.env.KSPEC_LSP_COMMAND) as string[];
			settings['kspec.server.command'] = command;
			settings['kspec.server.args'] = [...args, '--engine', 'inprocess'];
		}
		// the workspace is the repository: the extension finds .venv/bin/kspec there
		fake = createFakeVscode([repoRoot], settings);
		(Module as unknown as { _load: (...a: unknown[]) => unknown })._load = function (this: unknown, request: unknown, ...rest: unknown[]) {
			return request === 'vscode' ? fake.vscode : originalLoad.call(this, request, ...rest);
		};
		extension = require('../../src/extension');
	});

	after(async () => {
		(Module as unknown as { _load: unknown })._load = originalLoad;
		if (tmp) {
			fs.rmSync(tmp, { recursive: true, force: true });
		}
	});

	it('activates: registers its commands, starts the server, the status bar goes loading -> ready', async () => {
		extension.activate({ subscriptions: [] });
		for (const id of ['kspec.toggle', 'kspec.restart', 'kspec.showLog']) {
			assert.ok(fake.commands.has(id), id);
		}
		assert.equal(fake.statusItems.length, 1);
		assert.ok(item().visible);
		await until('a ready status bar', () => /^\$\(check\) kspec/.test(item().text), 120_000, () => `${item().text}\n${context()}`);
		assert.equal(item().command, 'kspec.toggle');
		assert.ok(fake.log.some((l) => l.includes('starting ') && l.includes(`(workspace environment ${path.join(repoRoot, '.venv')})`)) || process.env.KSPEC_LSP_COMMAND, context());
		assert.deepEqual(fake.errors, []);
		// the settings the user did not set went as null, which the server takes as "not set"
		assert.deepEqual(fake.log.filter((l) => l.startsWith('[warning message]')), [], context());
	});

	it(`returns k = ${K} inline items through the provider vscode-languageclient registered`, async () => {
		const provider = await until('an inline completion provider', () => fake.inlineProviders[0]?.provider, 10_000, context);
		const doc = makeDocument(path.join(tmp, 'example.py'), 'python', '# \ndef add(a, b):\n    return a + b\n');
		fake.openDocument(doc);
		const result = await provider.provideInlineCompletionItems(doc, new Position(0, 2),
			{ triggerKind: InlineCompletionTriggerKind.Automatic, selectedCompletionInfo: undefined }, new CancellationTokenSource().token);
		const items = Array.isArray(result) ? result : result?.items ?? [];
		assert.equal(items.length, K, `${JSON.stringify(items)}\n${context()}`);
		for (const it of items) {
			assert.equal(typeof it.insertText, 'string');
			assert.ok(it.insertText.length > 0);
			assert.deepEqual([it.range.end.line, it.range.end.character], [0, 2]);
		}
		// the completion list stays empty in VS Code (our middleware): inline text is the UI
		const completion = fake.completionProviders[0]?.provider;
		if (completion) {
			const list = await completion.provideCompletionItems(doc, new Position(0, 2), { triggerKind: 0 }, new CancellationTokenSource().token);
			assert.ok(list === undefined || list === null || (Array.isArray(list) ? list : list.items).length === 0);
		}
		// ...and the status bar shows the latency of that completion
		await until('a latency in the status bar', () => /^\$\(check\) kspec \d/.test(item().text), 10_000, () => item().text);
	});

	it('kspec.toggle turns completions off (status bar, client and server) and on again', async () => {
		const provider = fake.inlineProviders[0].provider;
		const doc = makeDocument(path.join(tmp, 'example.py'), 'python', '# \ndef add(a, b):\n    return a + b\n');
		const ask = async () => {
			const r = await provider.provideInlineCompletionItems(doc, new Position(0, 2),
				{ triggerKind: InlineCompletionTriggerKind.Invoke, selectedCompletionInfo: undefined }, new CancellationTokenSource().token);
			return Array.isArray(r) ? r : r?.items ?? [];
		};
		await fake.commands.get('kspec.toggle')!();
		assert.equal(fake.settings['kspec.enabled'], false);
		assert.equal(item().text, '$(circle-slash) kspec');
		assert.equal((await ask()).length, 0);
		await fake.commands.get('kspec.toggle')!();
		assert.equal(fake.settings['kspec.enabled'], true);
		assert.equal((await ask()).length, K);
	});

	it('kspec.languages limits the languages asked for, without a restart', async () => {
		const provider = fake.inlineProviders[0].provider;
		const doc = makeDocument(path.join(tmp, 'example.py'), 'python', '# \ndef add(a, b):\n    return a + b\n');
		const ask = async () => {
			const r = await provider.provideInlineCompletionItems(doc, new Position(0, 2),
				{ triggerKind: InlineCompletionTriggerKind.Invoke, selectedCompletionInfo: undefined }, new CancellationTokenSource().token);
			return Array.isArray(r) ? r : r?.items ?? [];
		};
		assert.equal(fake.settings['kspec.enabled'], true);
		assert.equal((await ask()).length, K);
		await fake.setSetting('kspec.languages', ['go']);
		assert.equal((await ask()).length, 0);
		await fake.setSetting('kspec.languages', ['go', 'python']);
		assert.equal((await ask()).length, K);
		assert.equal(fake.inlineProviders[0].provider, provider, 'the client was not restarted');
	});

	it('an engine error turns the status bar red with a click to the log; fixing the model recovers', async () => {
		await fake.setSetting('kspec.model', path.join(tmp, 'no-such-model'));
		await until('an error in the status bar', () => item().text === '$(error) kspec', 60_000, () => `${item().text}\n${context()}`);
		assert.equal(item().command, 'kspec.showLog');
		assert.equal(item().backgroundColor?.id, 'statusBarItem.errorBackground');
		assert.match(String(item().tooltip), /no-such-model|model/i);
		await fake.setSetting('kspec.model', model);
		await until('ready again', () => /^\$\(check\) kspec/.test(item().text), 120_000, () => `${item().text}\n${context()}`);
	});

	it('deactivates: the client stops and disposes its providers', async () => {
		await extension.deactivate();
		assert.equal(fake.inlineProviders.length, 0, 'providers disposed');
	});
});
