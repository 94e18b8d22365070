// The status bar item's state: fed by `$/kspec/status` notifications and by the
// client's own life cycle (starting, stopped, failed to start, disabled). No `vscode`
// import; extension.ts copies `view()` onto a StatusBarItem.

export const STATUS_METHOD = '$/kspec/status';

export type ServerState = 'loading' | 'ready' | 'error';

export interface StatusParams {
	state: ServerState;
	message: string;
	progress: number | null;
	lastLatencyMs: number | null;
	/** The model's name, when the server says (not in the DESIGN contract; sent by kspec lsp). */
	model?: string;
	/** kspec lsp: 'busy' while a request is with the engine, 'timedOut' when the last one got nothing by its deadline (absent: idle). */
	activity?: Activity;
	/** kspec lsp: the engine daemon's log file (absent for an engine inside kspec lsp: its messages are in this output channel). */
	logFile?: string;
	/** kspec lsp: the documents (URIs) whose engine work runs now: busy while any is. */
	decoding?: string[];
	/** kspec lsp: the last final answer's distinct alternatives of the k asked for. */
	alternatives?: { count: number; k: number };
}

export type Activity = 'busy' | 'timedOut';

/**
 * Validate a notification's params; undefined for anything malformed (logged, ignored).
 * Fields may be absent. The latency is `lastLatencyMs` in DESIGN.md §3; kspec lsp sends
 * `latencyMs` (the last answered request): both are read.
 */
export function parseStatus(raw: unknown): StatusParams | undefined {
	if (typeof raw !== 'object' || raw === null) {
		return undefined;
	}
	const r = raw as Record<string, unknown>;
	if (r.state !== 'loading' && r.state !== 'ready' && r.state !== 'error') {
		return undefined;
	}
	const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
	const out: StatusParams = {
		state: r.state,
		message: typeof r.message === 'string' ? r.message : '',
		progress: num(r.progress),
		lastLatencyMs: num(r.lastLatencyMs) ?? num(r.latencyMs),
	};
	if (Array.isArray(r.decoding)) {
		out.decoding = r.decoding.filter((u): u is string => typeof u === 'string' && u !== '');
	}
	const alt = r.alternatives as Record<string, unknown> | null | undefined;
	if (typeof alt === 'object' && alt !== null && Number.isInteger(alt.count) && Number.isInteger(alt.k)) {
		out.alternatives = { count: alt.count as number, k: alt.k as number };
	}
	if (typeof r.model === 'string' && r.model !== '') {
		out.model = r.model;
	}
	if (r.activity === 'busy' || r.activity === 'timedOut') {
		out.activity = r.activity;
	}
	if (typeof r.logFile === 'string' && r.logFile !== '') {
		out.logFile = r.logFile;
	}
	return out;
}

export type ClientPhase = 'starting' | 'running' | 'stopped' | 'failed';

export type Severity = 'normal' | 'warning' | 'error';

export interface StatusView {
	text: string;
	tooltip: string;
	/** Command id run on click. */
	command: string;
	severity: Severity;
}

export const COMMANDS = {
	toggle: 'kspec.toggle',
	restart: 'kspec.restart',
	showLog: 'kspec.showLog',
	showNext: 'kspec.showNext',
	showPrevious: 'kspec.showPrevious',
	dismiss: 'kspec.dismiss',
} as const;

/** The Settings editor's search for this extension's keys: `@ext:` shows them in whichever tab
 * holds them (the Remote tab under code-server or a remote window, where the machine-scoped keys
 * live), unlike a text search of the User tab. `<publisher>.<name>` of package.json. */
export const SETTINGS_FILTER = '@ext:kspec.kspec';

/** Progress as a whole percentage; the server sends a fraction in [0, 1]. */
export function percent(progress: number): number {
	return Math.round(Math.min(1, Math.max(0, progress)) * 100);
}

function ms(value: number): string {
	return value >= 10000 ? `${(value / 1000).toFixed(1)} s` : `${Math.round(value)} ms`;
}

/** What the last final answer offered to cycle (Alt+] / Alt+[), said when it was fewer than k. */
export function alternativesNote(alternatives: { count: number; k: number } | undefined): string {
	if (alternatives === undefined || alternatives.count >= alternatives.k) {
		return '';
	}
	const n = alternatives.count;
	return `; last answer: ${n} distinct alternative${n === 1 ? '' : 's'} of k = ${alternatives.k} (the others were the same text)`;
}

export class StatusModel {
	private enabled = true;
	private phase: ClientPhase = 'starting';
	private phaseMessage = '';
	private server: StatusParams | undefined;
	/** The last latency the server reported; kept when a later `ready` carries none. */
	private lastLatencyMs: number | null = null;

	setEnabled(enabled: boolean): void {
		this.enabled = enabled;
	}

	/** The client's life cycle. A new start forgets the previous server's state. */
	setPhase(phase: ClientPhase, message = ''): void {
		if (phase === 'starting') {
			this.server = undefined;
			this.lastLatencyMs = null;
		}
		this.phase = phase;
		this.phaseMessage = message;
	}

	/** The engine daemon's log file, when the server said where it is. */
	get engineLog(): string | undefined {
		return this.server?.logFile;
	}

	onServerStatus(params: StatusParams): void {
		this.server = params;
		if (params.lastLatencyMs !== null) {
			this.lastLatencyMs = params.lastLatencyMs;
		}
	}

	view(): StatusView {
		const clickLog = `Click to show the log.`;
		if (this.phase === 'failed' || this.phase === 'stopped') {
			const what = this.phase === 'failed' ? 'could not start' : 'stopped';
			return {
				text: '$(error) kspec',
				tooltip: `kspec server ${what}${this.phaseMessage ? ': ' + this.phaseMessage : ''}. ${clickLog}`,
				command: COMMANDS.showLog,
				severity: 'error',
			};
		}
		if (this.server?.state === 'error') {
			return {
				text: '$(error) kspec',
				tooltip: `kspec: ${this.server.message || 'error'}. ${clickLog}`,
				command: COMMANDS.showLog,
				severity: 'error',
			};
		}
		if (!this.enabled) {
			return {
				text: '$(circle-slash) kspec',
				tooltip: 'kspec completions are off. Click to turn them on.',
				command: COMMANDS.toggle,
				severity: 'warning',
			};
		}
		if (this.phase === 'starting' || this.server === undefined) {
			return {
				text: '$(loading~spin) kspec',
				tooltip: 'kspec: starting the server. Click to turn completions off.',
				command: COMMANDS.toggle,
				severity: 'normal',
			};
		}
		if (this.server.state === 'loading') {
			const pct = this.server.progress === null ? '' : ` ${percent(this.server.progress)}%`;
			return {
				text: `$(loading~spin) kspec${pct}`,
				tooltip: `kspec: ${this.server.message || 'loading the model'}${pct}. Click to turn completions off.`,
				command: COMMANDS.toggle,
				severity: 'normal',
			};
		}
		const docs = this.server.decoding?.length ?? 0;
		if (this.server.activity === 'busy' || docs > 0) {
			return {
				text: '$(sync~spin) kspec',
				tooltip: `kspec: decoding${docs > 1 ? ` for ${docs} documents` : ''}; the suggestion grows until done. Click to turn completions off.`,
				command: COMMANDS.toggle,
				severity: 'normal',
			};
		}
		if (this.server.activity === 'timedOut') {
			return {
				text: '$(watch) kspec timed out',
				tooltip: 'kspec: the last request got no suggestion by its deadline (kspec.deadlineMs): the engine is slower than that here, or busy. ' + clickLog,
				command: COMMANDS.showLog,
				severity: 'warning',
			};
		}
		const latency = this.lastLatencyMs === null ? '' : ` ${ms(this.lastLatencyMs)}`;
		return {
			text: `$(check) kspec${latency}`,
			tooltip:
				`kspec: ${this.server.message || 'ready'}` +
				(this.server.model ? `, model ${this.server.model}` : '') +
				(this.lastLatencyMs === null ? '' : ` (last completion ${ms(this.lastLatencyMs)})`) +
				alternativesNote(this.server.alternatives) +
				'. Click to turn completions off.',
			command: COMMANDS.toggle,
			severity: 'normal',
		};
	}
}
