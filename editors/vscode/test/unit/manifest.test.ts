// package.json is the UI of the settings and commands: it must agree with the code.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, it } from 'node:test';
import { DEFAULTS, ENGINES, SERVER_KEYS, USER_ONLY_KEYS } from '../../src/settings';
import { COMMANDS } from '../../src/status';

const root = path.resolve(__dirname, '..', '..', '..');
const manifest = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
const props: Record<string, { default: unknown; enum?: unknown[]; enumDescriptions?: string[]; scope?: string; markdownDescription?: string }> = manifest.contributes.configuration.properties;

describe('package.json', () => {
	it('declares every server setting with the same default as the code', () => {
		for (const key of SERVER_KEYS) {
			const prop = props[`kspec.${key}`];
			assert.ok(prop, `kspec.${key} missing from contributes.configuration`);
			assert.deepEqual(prop.default, DEFAULTS[key], `default of kspec.${key}`);
		}
	});

	it('offers exactly the engines the code accepts, each described', () => {
		const prop = props['kspec.engine'];
		assert.deepEqual(prop.enum, [...ENGINES]);
		assert.equal(prop.enumDescriptions?.length, ENGINES.length);
	});

	it('asks for the token file, never the token, and only from user (or remote) settings', () => {
		assert.ok(!Object.keys(props).some((k) => /token$|apikey/i.test(k)), 'a setting that holds the secret itself');
		const tokenFile = props['kspec.engineTokenFile'];
		assert.equal(tokenFile.scope, 'machine');
		assert.match(tokenFile.markdownDescription ?? '', /never put the token itself/);
	});

	it('lets only user (or remote) settings choose what runs and where code is sent', () => {
		for (const key of USER_ONLY_KEYS) {
			const scope = props[`kspec.${key}`].scope;
			assert.ok(scope === 'machine' || scope === 'application', `kspec.${key} must not come from a workspace (scope ${scope})`);
		}
		assert.equal(props['kspec.allowInsecureRemote'].scope, 'application');
		assert.equal(props['kspec.allowInsecureRemote'].default, false);
	});

	it('declares the launch settings with the same defaults', () => {
		assert.equal(props['kspec.server.command'].default, DEFAULTS.server.command);
		assert.deepEqual(props['kspec.server.args'].default, DEFAULTS.server.args);
		assert.deepEqual(props['kspec.server.env'].default, DEFAULTS.server.env);
	});

	it('declares nothing the code does not read (besides trace.server, read by the client library)', () => {
		const known = new Set([...SERVER_KEYS.map((k) => `kspec.${k}`), 'kspec.server.command', 'kspec.server.args', 'kspec.server.env', 'kspec.trace.server']);
		assert.deepEqual(Object.keys(props).filter((k) => !known.has(k)), []);
	});

	it('contributes every command the status bar and the extension use', () => {
		const declared = new Set(manifest.contributes.commands.map((c: { command: string }) => c.command));
		for (const id of Object.values(COMMANDS)) {
			assert.ok(declared.has(id), id);
		}
	});

	it('points main at the compiled extension and asks for a VS Code the client library supports', () => {
		assert.equal(manifest.main, './out/src/extension.js');
		assert.ok(fs.existsSync(path.join(root, manifest.main)), 'compile first');
		const client = JSON.parse(fs.readFileSync(path.join(root, 'node_modules/vscode-languageclient/package.json'), 'utf8'));
		assert.equal(manifest.engines.vscode, client.engines.vscode);
		const [major] = client.version.split('.').map(Number);
		assert.ok(major >= 10, `vscode-languageclient ${client.version} < 10 has no inline completion by default`);
	});
});
