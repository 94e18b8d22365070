import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { defaultIsExecutable, resolveServerCommand, ResolveContext, toExecutable } from '../../src/serverCommand';
import { DEFAULTS, KspecSettings } from '../../src/settings';

function settings(server: Partial<KspecSettings['server']> = {}): KspecSettings {
	return { ...DEFAULTS, server: { ...DEFAULTS.server, ...server } };
}

function context(executables: string[], over: Partial<ResolveContext> = {}): ResolveContext {
	const set = new Set(executables);
	return {
		platform: 'linux', env: { PATH: '/usr/local/bin:/usr/bin' }, home: '/home/u', workspaceFolders: ['/proj'],
		isExecutable: (f) => set.has(f), ...over,
	};
}

function ok(r: ReturnType<typeof resolveServerCommand>) {
	assert.ok(r.ok, r.ok ? '' : r.error);
	return r.value;
}

describe('resolveServerCommand', () => {
	it('prefers the setting, expanding ~ and ${workspaceFolder}', () => {
		const r = ok(resolveServerCommand(settings({ command: '${workspaceFolder}/tools/kspec', args: ['lsp', '-v'] }),
			context(['/proj/tools/kspec', '/proj/.venv/bin/kspec'])));
		assert.equal(r.command, '/proj/tools/kspec');
		assert.deepEqual(r.args, ['lsp', '-v']);
		assert.equal(r.source, 'setting kspec.server.command');
		assert.equal(r.cwd, '/proj');
	});

	it('passes a bare command name through (the OS searches PATH)', () => {
		assert.equal(ok(resolveServerCommand(settings({ command: 'kspec' }), context([]))).command, 'kspec');
	});

	it('says so when the configured path is not executable', () => {
		const r = resolveServerCommand(settings({ command: '~/nope/kspec' }), context([]));
		assert.equal(r.ok, false);
		assert.match(r.ok ? '' : r.error, /\/home\/u\/nope\/kspec is not an executable file/);
	});

	it('finds the workspace .venv before VIRTUAL_ENV, conda and PATH', () => {
		const all = ['/proj/.venv/bin/kspec', '/ve/bin/kspec', '/conda/bin/kspec', '/usr/bin/kspec'];
		const env = { PATH: '/usr/bin', VIRTUAL_ENV: '/ve', CONDA_PREFIX: '/conda' };
		assert.equal(ok(resolveServerCommand(settings(), context(all, { env }))).command, '/proj/.venv/bin/kspec');
		assert.equal(ok(resolveServerCommand(settings(), context(all.slice(1), { env }))).source, '$VIRTUAL_ENV');
		assert.equal(ok(resolveServerCommand(settings(), context(all.slice(2), { env }))).source, '$CONDA_PREFIX');
		assert.equal(ok(resolveServerCommand(settings(), context(all.slice(3), { env }))).command, '/usr/bin/kspec');
	});

	it('looks in every workspace folder and in venv/ too', () => {
		const r = ok(resolveServerCommand(settings(), context(['/b/venv/bin/kspec'], { workspaceFolders: ['/a', '/b'] })));
		assert.equal(r.command, '/b/venv/bin/kspec');
		assert.equal(r.cwd, '/a');
	});

	it('uses the folder of python.defaultInterpreterPath', () => {
		const r = ok(resolveServerCommand(settings(), context(['/envs/x/bin/kspec'], { pythonInterpreter: '/envs/x/bin/python3' })));
		assert.equal(r.source, 'python.defaultInterpreterPath');
		// the default value "python" is a bare name and is skipped
		assert.equal(resolveServerCommand(settings(), context([], { pythonInterpreter: 'python' })).ok, false);
	});

	it('uses Scripts\\kspec.exe on Windows', () => {
		const exe = path.join('C:\\proj', '.venv', 'Scripts', 'kspec.exe');
		const r = ok(resolveServerCommand(settings(), context([exe], { platform: 'win32', workspaceFolders: ['C:\\proj'], env: { Path: '' } })));
		assert.equal(r.command, exe);
	});

	it('fails with a message that says where it looked and what to set', () => {
		const r = resolveServerCommand(settings(), context([]));
		assert.equal(r.ok, false);
		const error = r.ok ? '' : r.error;
		assert.match(error, /\/proj\/\.venv\/bin/);
		assert.match(error, /kspec\.server\.command/);
	});

	it('merges kspec.server.env over the inherited environment', () => {
		const r = ok(resolveServerCommand(settings({ command: 'kspec', env: { KSPEC_LOG: 'debug', PATH: '/x' } }),
			context([], { env: { PATH: '/usr/bin', HOME: '/home/u', UNSET: undefined } })));
		assert.deepEqual(r.env, { PATH: '/x', HOME: '/home/u', KSPEC_LOG: 'debug' });
		assert.deepEqual(toExecutable(r), { command: 'kspec', args: ['lsp'], options: { env: r.env, cwd: '/proj' } });
	});
});

describe('defaultIsExecutable', () => {
	it('is true for an executable file, false for a plain file, a folder, nothing', (t) => {
		if (process.platform === 'win32') {
			t.skip('POSIX permissions');
			return;
		}
		const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kspec-'));
		try {
			const exe = path.join(dir, 'kspec');
			const plain = path.join(dir, 'plain');
			fs.writeFileSync(exe, '#!/bin/sh\n', { mode: 0o755 });
			fs.writeFileSync(plain, '', { mode: 0o644 });
			assert.equal(defaultIsExecutable(exe), true);
			assert.equal(defaultIsExecutable(plain), false);
			assert.equal(defaultIsExecutable(dir), false);
			assert.equal(defaultIsExecutable(path.join(dir, 'missing')), false);
		} finally {
			fs.rmSync(dir, { recursive: true, force: true });
		}
	});
});
