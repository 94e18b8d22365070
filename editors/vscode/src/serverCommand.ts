// Which `kspec` to start. No `vscode` import (tested by node directly).
//
// Order, first hit wins:
//   1. `kspec.server.command` when set (bare names are looked up on PATH by the OS);
//   2. a virtual environment inside a workspace folder: .venv, venv, .env, env;
//   3. the active environment of the shell VS Code was started from: $VIRTUAL_ENV, $CONDA_PREFIX;
//   4. next to the interpreter chosen in `python.defaultInterpreterPath`;
//   5. `kspec` on PATH.
// Not found: a message that says where we looked and what to set.

import * as fs from 'fs';
import * as path from 'path';
import { expandPath, KspecSettings } from './settings';

export interface ResolveContext {
	platform: NodeJS.Platform;
	env: Record<string, string | undefined>;
	home: string;
	workspaceFolders: string[];
	/** `python.defaultInterpreterPath`, if the user set one. */
	pythonInterpreter?: string;
	isExecutable(file: string): boolean;
}

export interface ServerCommand {
	command: string;
	args: string[];
	/** Where it was found, for the log: "setting kspec.server.command", "workspace .venv", ... */
	source: string;
	/** The whole environment for the child process (process env + kspec.server.env). */
	env: Record<string, string>;
	cwd?: string;
}

export type Resolved = { ok: true; value: ServerCommand } | { ok: false; error: string };

const VENV_NAMES = ['.venv', 'venv', '.env', 'env'];

export function defaultIsExecutable(file: string): boolean {
	try {
		const st = fs.statSync(file);
		if (!st.isFile()) {
			return false;
		}
		if (process.platform === 'win32') {
			return true;
		}
		fs.accessSync(file, fs.constants.X_OK);
		return true;
	} catch {
		return false;
	}
}

function scriptNames(platform: NodeJS.Platform): string[] {
	return platform === 'win32' ? ['kspec.exe', 'kspec.cmd', 'kspec'] : ['kspec'];
}

function binDir(platform: NodeJS.Platform, envRoot: string): string {
	return platform === 'win32' ? path.join(envRoot, 'Scripts') : path.join(envRoot, 'bin');
}

function childEnv(base: Record<string, string | undefined>, extra: Record<string, string>): Record<string, string> {
	const out: Record<string, string> = {};
	for (const [k, v] of Object.entries(base)) {
		if (v !== undefined) {
			out[k] = v;
		}
	}
	return { ...out, ...extra };
}

export function resolveServerCommand(settings: KspecSettings, ctx: ResolveContext): Resolved {
	const first = ctx.workspaceFolders[0];
	const env = childEnv(ctx.env, settings.server.env);
	const args = [...settings.server.args];
	const found = (command: string, source: string): Resolved => ({ ok: true, value: { command, args, source, env, cwd: first } });
	const names = scriptNames(ctx.platform);
	const inDir = (dir: string): string | undefined => {
		for (const name of names) {
			const file = path.join(dir, name);
			if (ctx.isExecutable(file)) {
				return file;
			}
		}
		return undefined;
	};

	if (settings.server.command !== '') {
		const command = expandPath(settings.server.command, { home: ctx.home, workspaceFolder: first }, ctx.env);
		if (/[\\/]/.test(command) && !ctx.isExecutable(command)) {
			return { ok: false, error: `kspec.server.command is ${JSON.stringify(settings.server.command)} but ${command} is not an executable file` };
		}
		return found(command, 'setting kspec.server.command');
	}
	const looked: string[] = [];
	for (const folder of ctx.workspaceFolders) {
		for (const venv of VENV_NAMES) {
			const dir = binDir(ctx.platform, path.join(folder, venv));
			looked.push(dir);
			const hit = inDir(dir);
			if (hit) {
				return found(hit, `workspace environment ${path.join(folder, venv)}`);
			}
		}
	}
	for (const name of ['VIRTUAL_ENV', 'CONDA_PREFIX']) {
		const root = ctx.env[name];
		if (root) {
			const dir = binDir(ctx.platform, root);
			looked.push(dir);
			const hit = inDir(dir) ?? (ctx.platform === 'win32' && name === 'CONDA_PREFIX' ? inDir(root) : undefined);
			if (hit) {
				return found(hit, `$${name}`);
			}
		}
	}
	if (ctx.pythonInterpreter) {
		const interp = expandPath(ctx.pythonInterpreter, { home: ctx.home, workspaceFolder: first }, ctx.env);
		if (/[\\/]/.test(interp)) {
			const dir = path.dirname(interp);
			looked.push(dir);
			const hit = inDir(dir);
			if (hit) {
				return found(hit, 'python.defaultInterpreterPath');
			}
		}
	}
	const pathVar = ctx.env.PATH ?? ctx.env.Path ?? '';
	for (const dir of pathVar.split(ctx.platform === 'win32' ? ';' : ':')) {
		if (dir === '') {
			continue;
		}
		const hit = inDir(dir);
		if (hit) {
			return found(hit, 'PATH');
		}
	}
	looked.push('PATH');
	return {
		ok: false,
		error:
			'kspec was not found (looked in ' + looked.join(', ') + '). ' +
			'Install it into the project environment (pip install kspec) or set kspec.server.command.',
	};
}

/** The `Executable` shape of vscode-languageclient/node (stdio is its default transport). */
export interface ExecutableLike {
	command: string;
	args: string[];
	options: { env: Record<string, string>; cwd?: string };
}

export function toExecutable(cmd: ServerCommand): ExecutableLike {
	return { command: cmd.command, args: [...cmd.args], options: { env: cmd.env, cwd: cmd.cwd } };
}
