// Settings: VS Code's `kspec.*` configuration, validated, and mapped onto the flat
// object the server reads from `initializationOptions` and
// `workspace/didChangeConfiguration` (DESIGN.md §3). No `vscode` import: the node
// tests run this file as it is.

import * as os from 'os';
import * as path from 'path';

/** What the server understands, key for key (the server's names). */
export interface ServerSettings {
	model: string | null;
	draft: string | null;
	device: string;
	dtype: Dtype;
	/** Where the model runs: the shared local daemon, inside the server, a kspec engine on the network, or an OpenAI-compatible server. */
	engine: EnginePlacement;
	/** `tcp://HOST:PORT` / `tls://HOST:PORT` (remote), `http(s)://HOST:PORT/v1` (openai). */
	engineUrl: string | null;
	/** A file holding the token / API key (never the token itself). */
	engineTokenFile: string | null;
	/** TLS: trust this certificate or CA (self-signed servers). */
	engineCaFile: string | null;
	/** Allow an engine URL on another machine over plain http:// or tcp:// (the server refuses it otherwise). */
	allowInsecureRemote: boolean;
	/** openai: the model to ask for; null: the first one the server lists. */
	remoteModel: string | null;
	/** openai: 'suffix' (the API's suffix field) or a template with {prefix} and {suffix}. */
	remoteFim: string;
	k: number;
	maxTokens: number;
	mode: Mode;
	temperature: number;
	debounceMs: number;
	deadlineMs: number;
	languages: string[];
	enabled: boolean;
	/** Other open files of the workspace folder and the definitions the file imports as context. */
	contextFiles: boolean;
	/** Their cap in tokens; the engine's machine fit may choose less. */
	contextTokens: number;
}

export type EnginePlacement = 'daemon' | 'inprocess' | 'remote' | 'openai';
export const ENGINES: readonly EnginePlacement[] = ['daemon', 'inprocess', 'remote', 'openai'];
// The choices, defaults and limits here are the server's (lsp_server/settings.py): a Python
// test (tests/unit/lsp/test_settings_schema.py) reads this file and package.json and fails on a difference.
export const DTYPES = ['auto', 'float32', 'bfloat16', 'float16'] as const;
export type Dtype = (typeof DTYPES)[number];
export const MODES = ['diverse', 'sample'] as const;
export type Mode = (typeof MODES)[number];

/** Client-only settings: how to start the server. */
export interface ServerLaunchSettings {
	/** Empty: find `kspec` in the project's environment (see serverCommand.ts). */
	command: string;
	args: string[];
	env: Record<string, string>;
}

export interface KspecSettings extends ServerSettings {
	server: ServerLaunchSettings;
	/**
	 * The server settings the user set (in any scope), when VS Code says (`inspect`): only
	 * these are sent with their values, the others as null ("not set"), so that the server's
	 * defaults apply, including those it fits to the machine (k, maxTokens). Absent: all are sent.
	 */
	userSet?: (keyof ServerSettings)[];
}

/** The defaults; package.json's `contributes.configuration` must say the same (tested). */
export const DEFAULTS: KspecSettings = {
	model: null,
	draft: null,
	device: 'cpu',
	dtype: 'auto',
	engine: 'daemon',
	engineUrl: null,
	engineTokenFile: null,
	engineCaFile: null,
	allowInsecureRemote: false,
	remoteModel: null,
	remoteFim: 'auto',
	k: 3,
	maxTokens: 48,
	mode: 'diverse',
	temperature: 0,
	debounceMs: 10,
	deadlineMs: 3000,
	languages: [],
	enabled: true,
	contextFiles: true,
	contextTokens: 1024,
	server: { command: '', args: ['lsp'], env: {} },
};

/** The keys sent to the server, in the order the server documents them. */
export const SERVER_KEYS: readonly (keyof ServerSettings)[] = [
	'model', 'draft', 'device', 'dtype', 'engine', 'engineUrl', 'engineTokenFile', 'engineCaFile', 'allowInsecureRemote', 'remoteModel', 'remoteFim', 'k', 'maxTokens', 'mode', 'temperature', 'debounceMs', 'deadlineMs', 'languages', 'enabled', 'contextFiles', 'contextTokens',
];

/**
 * Settings that decide what runs and where code and keys are sent: taken from user (or
 * remote) settings only, never from a workspace's .vscode/settings.json. package.json
 * scopes them "machine" / "application", which VS Code applies; this is the same rule
 * where it would not (and the reason a workspace value is reported as ignored).
 */
export const USER_ONLY_KEYS: readonly string[] = [
	'engine', 'engineUrl', 'engineTokenFile', 'engineCaFile', 'allowInsecureRemote', 'server.command', 'server.args', 'server.env',
];

/** Where VS Code found a setting's value (`WorkspaceConfiguration.inspect`); the default is not among them. */
export interface InspectedValue {
	globalValue?: unknown;
	workspaceValue?: unknown;
	workspaceFolderValue?: unknown;
	globalLanguageValue?: unknown;
	workspaceLanguageValue?: unknown;
	workspaceFolderLanguageValue?: unknown;
}

/** The part of `vscode.WorkspaceConfiguration` we use (section `kspec`). */
export interface ConfigSource {
	/** The value, the manifest's default included. */
	get<T>(key: string): T | undefined;
	/** Where the value comes from; without it every value counts as the user's. */
	inspect?(key: string): InspectedValue | undefined;
}

/** Did the user set `key` (user, workspace or folder settings, for all languages or one)? */
export function isUserSet(cfg: ConfigSource, key: string): boolean {
	if (cfg.inspect === undefined) {
		return true;
	}
	const found = cfg.inspect(key);
	if (USER_ONLY_KEYS.includes(key)) {
		return found?.globalValue !== undefined;
	}
	return found !== undefined && [
		found.globalValue, found.workspaceValue, found.workspaceFolderValue,
		found.globalLanguageValue, found.workspaceLanguageValue, found.workspaceFolderLanguageValue,
	].some((value) => value !== undefined);
}

/** Where `~` and `${workspaceFolder}` point when a path setting uses them. */
export interface PathContext {
	home: string;
	workspaceFolder?: string;
}

export interface ReadResult {
	settings: KspecSettings;
	/** One line per setting that was ignored (wrong type, out of range); shown in the log. */
	problems: string[];
}

export function defaultPathContext(workspaceFolder?: string): PathContext {
	return { home: os.homedir(), workspaceFolder };
}

/** `~/x`, `${workspaceFolder}/x`, `${env:NAME}`; relative paths are resolved against the workspace folder. */
export function expandPath(value: string, ctx: PathContext, env: Record<string, string | undefined> = process.env): string {
	let out = value.trim();
	out = out.replace(/\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}/g, (_m, name: string) => env[name] ?? '');
	if (ctx.workspaceFolder !== undefined) {
		out = out.replace(/\$\{workspaceFolder\}/g, ctx.workspaceFolder);
	}
	if (out === '~') {
		out = ctx.home;
	} else if (out.startsWith('~/') || out.startsWith('~\\')) {
		out = path.join(ctx.home, out.slice(2));
	}
	if (out !== '' && !path.isAbsolute(out) && ctx.workspaceFolder !== undefined && /[\\/]/.test(out)) {
		out = path.resolve(ctx.workspaceFolder, out);
	}
	return out;
}

/** '"a", "b" or "c"' */
function oneOf(choices: readonly string[]): string {
	return choices.map((c) => `"${c}"`).join(', ').replace(/, ([^,]*)$/, ' or $1');
}

function isInt(value: unknown): value is number {
	return typeof value === 'number' && Number.isInteger(value);
}

/**
 * Read and validate. A bad value falls back to the default with a message,
 * never an exception: a typo in settings.json must not take completions away.
 */
export function readSettings(cfg: ConfigSource, ctx: PathContext = defaultPathContext()): ReadResult {
	const problems: string[] = [];
	const s: KspecSettings = { ...DEFAULTS, languages: [...DEFAULTS.languages], server: { ...DEFAULTS.server, args: [...DEFAULTS.server.args], env: {} } };

	const userSet: (keyof ServerSettings)[] = [];
	function take<T>(key: string, ok: (v: unknown) => v is T, expected: string, apply: (v: T) => void): void {
		const value = USER_ONLY_KEYS.includes(key) ? userValue(key) : cfg.get<unknown>(key);
		if (value === undefined || value === null) {
			return;
		}
		if (ok(value)) {
			apply(value);
			if ((SERVER_KEYS as readonly string[]).includes(key) && isUserSet(cfg, key)) {
				userSet.push(key as keyof ServerSettings);
			}
		} else {
			problems.push(`kspec.${key}: expected ${expected}, got ${JSON.stringify(value)}; using the default`);
		}
	}
	function userValue(key: string): unknown {
		if (cfg.inspect === undefined) {
			return cfg.get<unknown>(key);
		}
		const found = cfg.inspect(key);
		const fromWorkspace = [found?.workspaceValue, found?.workspaceFolderValue, found?.workspaceLanguageValue, found?.workspaceFolderLanguageValue];
		if (fromWorkspace.some((v) => v !== undefined)) {
			problems.push(`kspec.${key} in workspace settings is ignored: what runs and where code is sent come from user settings only`);
		}
		return found?.globalValue;
	}
	const isBool = (v: unknown): v is boolean => typeof v === 'boolean';
	const isString = (v: unknown): v is string => typeof v === 'string';
	const intIn = (lo: number, hi: number) => (v: unknown): v is number => isInt(v) && v >= lo && v <= hi;
	const numIn = (lo: number, hi: number) => (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= lo && v <= hi;
	const isStringList = (v: unknown): v is string[] => Array.isArray(v) && v.every((x) => typeof x === 'string');
	const isDevice = (v: unknown): v is string => typeof v === 'string' && /^(cpu|cuda(:\d+)?)$/.test(v.trim());
	const isDtype = (v: unknown): v is Dtype => typeof v === 'string' && (DTYPES as readonly string[]).includes(v);
	const isMode = (v: unknown): v is Mode => typeof v === 'string' && (MODES as readonly string[]).includes(v);
	const isEngine = (v: unknown): v is EnginePlacement => typeof v === 'string' && (ENGINES as readonly string[]).includes(v);
	// The server parses the URL fully (and says which scheme goes with which engine); here only the scheme.
	const isEngineUrl = (v: unknown): v is string => typeof v === 'string' && (v.trim() === '' || /^(tcp|tls|https?):\/\/\S+$/i.test(v.trim()));
	const isFim = (v: unknown): v is string => typeof v === 'string' && (['', 'auto', 'suffix'].includes(v.trim()) || (v.includes('{prefix}') && v.includes('{suffix}')));
	const isEnv = (v: unknown): v is Record<string, string> =>
		typeof v === 'object' && v !== null && !Array.isArray(v) && Object.values(v).every((x) => typeof x === 'string');

	take('enabled', isBool, 'true or false', (v) => { s.enabled = v; });
	take('contextFiles', isBool, 'true or false', (v) => { s.contextFiles = v; });
	take('contextTokens', intIn(0, 8192), 'an integer from 0 to 8192', (v) => { s.contextTokens = v; });
	take('model', isString, 'a model name, a path, or empty for the default model', (v) => { s.model = v.trim() === '' ? null : expandPath(v, ctx); });
	take('draft', isString, 'a path (or empty for none)', (v) => { s.draft = v.trim() === '' ? null : expandPath(v, ctx); });
	take('device', isDevice, '"cpu" or "cuda[:N]"', (v) => { s.device = v.trim(); });
	take('dtype', isDtype, oneOf(DTYPES), (v) => { s.dtype = v; });
	take('engine', isEngine, `one of ${ENGINES.map((e) => `"${e}"`).join(', ')}`, (v) => { s.engine = v; });
	take('engineUrl', isEngineUrl, 'a URL: tcp:// or tls://HOST:PORT (remote), http(s)://HOST:PORT/v1 (openai), or empty', (v) => { s.engineUrl = v.trim() === '' ? null : v.trim(); });
	take('engineTokenFile', isString, 'the path of a file holding the token (or empty)', (v) => { s.engineTokenFile = v.trim() === '' ? null : expandPath(v, ctx); });
	take('allowInsecureRemote', isBool, 'true or false', (v) => { s.allowInsecureRemote = v; });
	take('engineCaFile', isString, 'the path of a PEM certificate (or empty)', (v) => { s.engineCaFile = v.trim() === '' ? null : expandPath(v, ctx); });
	take('remoteModel', isString, 'a model name (or empty for the first one listed)', (v) => { s.remoteModel = v.trim() === '' ? null : v.trim(); });
	take('remoteFim', isFim, '"auto", "suffix" or a template containing {prefix} and {suffix}', (v) => { s.remoteFim = v.trim() === '' ? 'auto' : ['auto', 'suffix'].includes(v.trim()) ? v.trim() : v; });
	take('k', intIn(1, 32), 'an integer from 1 to 32', (v) => { s.k = v; });
	take('maxTokens', intIn(1, 512), 'an integer from 1 to 512', (v) => { s.maxTokens = v; });
	take('mode', isMode, oneOf(MODES), (v) => { s.mode = v; });
	take('temperature', numIn(0, 2), 'a number from 0 to 2', (v) => { s.temperature = v; });
	take('debounceMs', numIn(0, 2000), 'a number from 0 to 2000', (v) => { s.debounceMs = v; });
	take('deadlineMs', numIn(50, 120000), 'a number from 50 to 120000', (v) => { s.deadlineMs = v; });
	take('languages', isStringList, 'a list of language ids', (v) => { s.languages = v.map((x) => x.trim()).filter((x) => x !== ''); });
	take('server.command', isString, 'a command or path', (v) => { s.server.command = v.trim(); });
	take('server.args', isStringList, 'a list of strings', (v) => { s.server.args = [...v]; });
	take('server.env', isEnv, 'an object of string values', (v) => { s.server.env = { ...v }; });
	if (cfg.inspect !== undefined) {
		s.userSet = userSet;
	}
	return { settings: s, problems };
}

/** The flat object the server reads; with `s.userSet`, what the user did not set is null (the server's default). */
export function toServerSettings(s: KspecSettings): SentSettings {
	const all = allServerSettings(s);
	if (s.userSet === undefined) {
		return all;
	}
	const set = new Set<string>(s.userSet);
	return Object.fromEntries(SERVER_KEYS.map((key) => [key, set.has(key) ? all[key] : null])) as SentSettings;
}

/** What is sent: each server setting, or null for "not set". */
export type SentSettings = { [K in keyof ServerSettings]: ServerSettings[K] | null };

function allServerSettings(s: KspecSettings): ServerSettings {
	return {
		model: s.model,
		draft: s.draft,
		device: s.device,
		dtype: s.dtype,
		engine: s.engine,
		engineUrl: s.engineUrl,
		engineTokenFile: s.engineTokenFile,
		engineCaFile: s.engineCaFile,
		allowInsecureRemote: s.allowInsecureRemote,
		remoteModel: s.remoteModel,
		remoteFim: s.remoteFim,
		k: s.k,
		maxTokens: s.maxTokens,
		mode: s.mode,
		temperature: s.temperature,
		debounceMs: s.debounceMs,
		deadlineMs: s.deadlineMs,
		languages: [...s.languages],
		enabled: s.enabled,
		contextFiles: s.contextFiles,
		contextTokens: s.contextTokens,
	};
}

/** Whether to ask the server at all for a document of this language. */
export function shouldComplete(s: ServerSettings, languageId: string): boolean {
	return s.enabled && (s.languages.length === 0 || s.languages.includes(languageId));
}

/** Did a configuration change touch something that needs a new server process? */
export function needsRestart(before: KspecSettings, after: KspecSettings): boolean {
	return JSON.stringify(before.server) !== JSON.stringify(after.server);
}
