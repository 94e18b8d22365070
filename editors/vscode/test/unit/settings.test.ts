import assert from 'node:assert/strict';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { DEFAULTS, expandPath, needsRestart, readSettings, SERVER_KEYS, shouldComplete, toServerSettings, USER_ONLY_KEYS } from '../../src/settings';

/** A stand-in for vscode.WorkspaceConfiguration: nested keys as 'server.command'. */
function config(values: Record<string, unknown>) {
	return { get: <T>(key: string): T | undefined => values[key] as T | undefined };
}
const ctx = { home: '/home/u', workspaceFolder: '/proj' };

describe('readSettings', () => {
	it('gives the defaults when nothing is set', () => {
		const { settings, problems } = readSettings(config({}), ctx);
		assert.deepEqual(settings, DEFAULTS);
		assert.deepEqual(problems, []);
	});

	it('takes every valid value and maps it onto the server keys', () => {
		const { settings, problems } = readSettings(config({
			enabled: false, model: '~/models/qwen', draft: '${workspaceFolder}/draft.gguf', device: 'cuda:1', dtype: 'bfloat16', k: 7, maxTokens: 100,
			mode: 'sample', temperature: 0.6, debounceMs: 10, deadlineMs: 900, languages: ['python', ' go ', ''],
			contextFiles: false, contextTokens: 512,
			'server.command': ' /opt/kspec/bin/kspec ', 'server.args': ['lsp', '--log', 'debug'], 'server.env': { KSPEC_X: '1' },
		}), ctx);
		assert.deepEqual(problems, []);
		assert.deepEqual(toServerSettings(settings), {
			model: '/home/u/models/qwen', draft: '/proj/draft.gguf', device: 'cuda:1', dtype: 'bfloat16',
			engine: 'daemon', engineUrl: null, engineTokenFile: null, engineCaFile: null, allowInsecureRemote: false, remoteModel: null, remoteFim: 'auto',
			k: 7, maxTokens: 100, mode: 'sample',
			temperature: 0.6, debounceMs: 10, deadlineMs: 900, languages: ['python', 'go'], enabled: false,
			contextFiles: false, contextTokens: 512,
		});
		assert.deepEqual(settings.server, { command: '/opt/kspec/bin/kspec', args: ['lsp', '--log', 'debug'], env: { KSPEC_X: '1' } });
	});

	it('sends exactly the server keys, none of the client-only ones', () => {
		const sent = toServerSettings(readSettings(config({ 'server.command': 'x' }), ctx).settings);
		assert.deepEqual(Object.keys(sent).sort(), [...SERVER_KEYS].sort());
		assert.ok(!('server' in sent));
	});

	it('empty model and draft mean null (the embedded default, no draft)', () => {
		const s = readSettings(config({ model: '  ', draft: '' }), ctx).settings;
		assert.equal(s.model, null);
		assert.equal(s.draft, null);
	});

	it('falls back to the default, with one message per bad value, never throws', () => {
		const { settings, problems } = readSettings(config({
			k: 0, device: "gpu", dtype: "fp8", maxTokens: 2.5, mode: 'greedy', temperature: -1, debounceMs: '50', deadlineMs: 10,
			languages: 'python', enabled: 'yes', model: 3, 'server.args': 'lsp', 'server.env': { A: 1 },
			contextFiles: 'on', contextTokens: 9000,
		}), ctx);
		const expected = { ...DEFAULTS, server: { ...DEFAULTS.server } };
		assert.deepEqual(settings, expected);
		assert.equal(problems.length, 15);
		assert.ok(problems.some((p) => p.startsWith('kspec.contextTokens: expected an integer from 0 to 8192')));
		assert.ok(problems.some((p) => p.startsWith('kspec.k: expected an integer from 1 to 32')));
		assert.ok(problems.some((p) => p.startsWith('kspec.mode: expected "diverse" or "sample", got "greedy"')));
	});

	it('takes a team engine on the network, expanding ~ and ${workspaceFolder} in the token and CA paths', () => {
		const { settings, problems } = readSettings(config({
			engine: 'openai', engineUrl: ' http://gpu-box:8000/v1 ', engineTokenFile: '~/.config/kspec/token',
			engineCaFile: '${workspaceFolder}/certs/ca.pem', remoteModel: ' qwen2.5-coder ', remoteFim: '<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>',
		}), ctx);
		assert.deepEqual(problems, []);
		const sent = toServerSettings(settings);
		assert.equal(sent.engine, 'openai');
		assert.equal(sent.engineUrl, 'http://gpu-box:8000/v1');
		assert.equal(sent.engineTokenFile, path.join('/home/u', '.config/kspec/token'));
		assert.equal(sent.engineCaFile, '/proj/certs/ca.pem');
		assert.equal(sent.remoteModel, 'qwen2.5-coder');
		assert.equal(sent.remoteFim, '<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>');
		for (const url of ['tcp://10.0.0.5:8000', 'tls://gpu-box:8443', 'https://llm.example.com/v1']) {
			const r = readSettings(config({ engine: 'remote', engineUrl: url }), ctx);
			assert.deepEqual(r.problems, [], url);
			assert.equal(r.settings.engineUrl, url);
		}
	});

	it('empty network-engine strings mean null (remoteFim: "auto")', () => {
		const s = readSettings(config({ engineUrl: ' ', engineTokenFile: '', engineCaFile: '  ', remoteModel: '', remoteFim: '' }), ctx).settings;
		assert.deepEqual([s.engineUrl, s.engineTokenFile, s.engineCaFile, s.remoteModel, s.remoteFim], [null, null, null, null, 'auto']);
		assert.equal(readSettings(config({ remoteFim: ' suffix ' }), ctx).settings.remoteFim, 'suffix');
		assert.equal(readSettings(config({ remoteFim: 'auto' }), ctx).settings.remoteFim, 'auto');
	});

	it('rejects a bad engine, URL scheme or FIM template, keeping the defaults', () => {
		const { settings, problems } = readSettings(config({
			engine: 'cloud', engineUrl: 'gpu-box:8000', engineTokenFile: 42, engineCaFile: ['x'], remoteModel: false, remoteFim: '<fim_prefix>{prefix}',
		}), ctx);
		assert.deepEqual(settings, DEFAULTS);
		assert.equal(problems.length, 6, problems.join('\n'));
		assert.ok(problems.some((p) => p.startsWith('kspec.engine: expected one of "daemon", "inprocess", "remote", "openai", got "cloud"')));
		assert.ok(problems.some((p) => p.startsWith('kspec.engineUrl: expected a URL')));
		assert.ok(problems.some((p) => p.startsWith('kspec.remoteFim: expected "auto", "suffix" or a template')));
		assert.equal(readSettings(config({ engineUrl: 'ftp://x:1' }), ctx).problems.length, 1);
	});

	it('does not share arrays with DEFAULTS (a later mutation cannot leak)', () => {
		const s = readSettings(config({}), ctx).settings;
		s.languages.push('x');
		s.server.args.push('y');
		assert.deepEqual(DEFAULTS.languages, []);
		assert.deepEqual(DEFAULTS.server.args, ['lsp']);
	});
});

describe('expandPath', () => {
	it('expands ~, ${workspaceFolder}, ${env:X} and resolves relative paths in the workspace', () => {
		assert.equal(expandPath('~', ctx), '/home/u');
		assert.equal(expandPath('~/m', ctx), path.join('/home/u', 'm'));
		assert.equal(expandPath('${workspaceFolder}/m', ctx), '/proj/m');
		assert.equal(expandPath('${env:MODELS}/q', ctx, { MODELS: '/data' }), '/data/q');
		assert.equal(expandPath('models/q.gguf', ctx), path.resolve('/proj', 'models/q.gguf'));
	});
	it('leaves bare names alone (hub ids, commands on PATH)', () => {
		assert.equal(expandPath('kspec', ctx), 'kspec');
		assert.equal(expandPath('/abs/x', { home: '/h' }), '/abs/x');
	});
});

describe('shouldComplete', () => {
	it('is off when disabled, on for every language when the list is empty, else only listed', () => {
		const on = { ...DEFAULTS };
		assert.equal(shouldComplete(on, 'python'), true);
		assert.equal(shouldComplete({ ...on, enabled: false }, 'python'), false);
		assert.equal(shouldComplete({ ...on, languages: ['go'] }, 'python'), false);
		assert.equal(shouldComplete({ ...on, languages: ['go', 'python'] }, 'python'), true);
	});
});

describe('needsRestart', () => {
	it('only for the launch settings; model/k/... go through didChangeConfiguration', () => {
		const a = readSettings(config({}), ctx).settings;
		assert.equal(needsRestart(a, readSettings(config({ k: 2, model: '/m' }), ctx).settings), false);
		assert.equal(needsRestart(a, readSettings(config({ 'server.command': '/x/kspec' }), ctx).settings), true);
		assert.equal(needsRestart(a, readSettings(config({ 'server.env': { A: 'b' } }), ctx).settings), true);
	});
});

describe('only what the user set is sent', () => {
	/** vscode.WorkspaceConfiguration: `get` gives the manifest's default too, `inspect` says who set a value. */
	function vscodeConfig(user: Record<string, unknown>) {
		const defaults: Record<string, unknown> = { k: 3, maxTokens: 48, enabled: true, engine: 'daemon', deadlineMs: 3000 };
		return {
			get: <T>(key: string): T | undefined => (key in user ? user[key] : defaults[key]) as T | undefined,
			inspect: (key: string) => ({ defaultValue: defaults[key], globalValue: key === 'k' ? undefined : user[key], workspaceFolderValue: key === 'k' ? user[key] : undefined }),
		};
	}

	it('sends null for every setting the user did not set, so the machine-fitted defaults apply', () => {
		const { settings, problems } = readSettings(vscodeConfig({ deadlineMs: 500 }), ctx);
		assert.deepEqual(problems, []);
		assert.equal(settings.k, 3); // what the client itself uses: the default
		const sent = toServerSettings(settings);
		assert.deepEqual(Object.keys(sent).sort(), [...SERVER_KEYS].sort());
		assert.equal(sent.deadlineMs, 500);
		for (const key of SERVER_KEYS.filter((k) => k !== 'deadlineMs')) {
			assert.equal(sent[key], null, key);
		}
	});

	it('a value set in any scope is sent; a removed one goes back to null', () => {
		const sent = toServerSettings(readSettings(vscodeConfig({ k: 5, maxTokens: 64 }), ctx).settings);
		assert.equal(sent.k, 5); // a folder setting
		assert.equal(sent.maxTokens, 64);
		assert.equal(toServerSettings(readSettings(vscodeConfig({}), ctx).settings).maxTokens, null);
	});

	it('an invalid value is not sent', () => {
		const { settings, problems } = readSettings(vscodeConfig({ maxTokens: 'many' }), ctx);
		assert.equal(problems.length, 1);
		assert.equal(toServerSettings(settings).maxTokens, null);
	});
});

describe('a workspace cannot choose what runs or where code goes', () => {
	/** A repository's .vscode/settings.json, as `inspect` reports it: workspaceValue only. */
	function workspaceConfig(workspace: Record<string, unknown>, user: Record<string, unknown> = {}) {
		return {
			get: <T>(key: string): T | undefined => (key in workspace ? workspace[key] : user[key]) as T | undefined,
			inspect: (key: string) => ({ globalValue: user[key], workspaceValue: workspace[key] }),
		};
	}

	it('ignores server.command/args/env, engine, engineUrl, token and CA files and allowInsecureRemote from a workspace, and says so', () => {
		const hostile = {
			'server.command': '/tmp/evil', 'server.args': ['lsp', '--engine-url', 'http://host/v1'], 'server.env': { OPENAI_API_KEY: 'x' },
			engine: 'openai', engineUrl: 'http://host/v1', engineTokenFile: '/home/u/.ssh/id_rsa', engineCaFile: '/tmp/ca.pem', allowInsecureRemote: true,
			k: 5,
		};
		const { settings, problems } = readSettings(workspaceConfig(hostile), ctx);
		assert.deepEqual(settings.server, DEFAULTS.server);
		assert.equal(settings.engine, 'daemon');
		assert.equal(settings.engineUrl, null);
		assert.equal(settings.engineTokenFile, null);
		assert.equal(settings.engineCaFile, null);
		assert.equal(settings.allowInsecureRemote, false);
		assert.equal(settings.k, 5); // other settings still come from the workspace
		assert.equal(problems.length, USER_ONLY_KEYS.length);
		assert.ok(problems.every((p) => p.includes('ignored')));
		const sent = toServerSettings(settings);
		assert.equal(sent.engineUrl, null);
		assert.equal(sent.allowInsecureRemote, null);
	});

	it('takes the same settings from the user', () => {
		const user = { 'server.args': ['lsp', '--log-level', 'info'], engine: 'openai', engineUrl: 'https://host/v1', allowInsecureRemote: true };
		const { settings, problems } = readSettings(workspaceConfig({}, user), ctx);
		assert.deepEqual(problems, []);
		assert.deepEqual(settings.server.args, ['lsp', '--log-level', 'info']);
		const sent = toServerSettings(settings);
		assert.equal(sent.engine, 'openai');
		assert.equal(sent.engineUrl, 'https://host/v1');
		assert.equal(sent.allowInsecureRemote, true);
	});
});
