// VS Code glue: starts `kspec lsp`, keeps its settings in step, shows its status.
// Inline completions come from vscode-languageclient's built-in LSP 3.18 feature;
// VS Code's own next/previous inline suggestion commands (Alt+] / Alt+[) cycle the
// k items the server returns; while the server still decodes for the document, Alt+] / Alt+[
// run kspec.showNext / kspec.showPrevious instead (bound on the context key
// kspec.activeDocumentDecoding), which wait for the final alternatives first.
// `$/kspec/suggestionsUpdated` hides and re-triggers the suggestion when the server has longer
// ones for the text on screen. Everything that can be decided without VS Code lives in
// settings.ts, serverCommand.ts, status.ts, decoding.ts and suggestionsUpdated.ts (tested under node).

import * as os from 'os';
import * as vscode from 'vscode';
import {
	DidChangeConfigurationNotification,
	LanguageClient,
	LanguageClientOptions,
	RevealOutputChannelOn,
	State,
} from 'vscode-languageclient/node';
import { defaultIsExecutable, resolveServerCommand, toExecutable } from './serverCommand';
import { defaultPathContext, KspecSettings, needsRestart, readSettings, shouldComplete, toServerSettings } from './settings';
import { cycle, DecodingDocuments, HIDE_INLINE_SUGGEST, SHOW_NEXT_INLINE_SUGGEST, SHOW_PREVIOUS_INLINE_SUGGEST, showAgain } from './decoding';
import { COMMANDS, parseStatus, SETTINGS_FILTER, STATUS_METHOD, StatusModel } from './status';
import { Answers, declareSuggestionsUpdated, hasItems, SUGGESTIONS_UPDATED_METHOD, suggestionsUpdatedHandler } from './suggestionsUpdated';

/** Set while the active editor's document is being decoded for: Alt+] / Alt+[ then join it. */
const DECODING_CONTEXT_KEY = 'kspec.activeDocumentDecoding';

class KspecExtension implements vscode.Disposable {
	private client: LanguageClient | undefined;
	private settings: KspecSettings;
	private readonly status = new StatusModel();
	private readonly decoding = new DecodingDocuments();
	/** The last inline completion answer per document: `$/kspec/suggestionsUpdated` asks again by it. */
	private readonly answers = new Answers();
	private decodingKey = false;
	private readonly item: vscode.StatusBarItem;
	private readonly log: vscode.LogOutputChannel;
	private readonly disposables: vscode.Disposable[] = [];
	/** Start / stop / restart run one after the other, never interleaved. */
	private queue: Promise<void> = Promise.resolve();
	/** Set while we stop the client ourselves, so that "Stopped" is not shown as a failure. */
	private stopping = false;

	constructor() {
		this.log = vscode.window.createOutputChannel('kspec', { log: true });
		this.item = vscode.window.createStatusBarItem('kspec.status', vscode.StatusBarAlignment.Right, 100);
		this.item.name = 'kspec';
		this.settings = this.read();
		this.status.setEnabled(this.settings.enabled);
		this.render();
		this.item.show();
		this.disposables.push(
			this.log,
			this.item,
			vscode.commands.registerCommand(COMMANDS.toggle, () => this.toggle()),
			vscode.commands.registerCommand(COMMANDS.restart, () => this.enqueue(() => this.restartNow())),
			vscode.commands.registerCommand(COMMANDS.showLog, () => this.showLog()),
			vscode.commands.registerCommand(COMMANDS.showNext, () => cycle(this.cycleDeps(), SHOW_NEXT_INLINE_SUGGEST)),
			vscode.commands.registerCommand(COMMANDS.showPrevious, () => cycle(this.cycleDeps(), SHOW_PREVIOUS_INLINE_SUGGEST)),
			vscode.commands.registerCommand(COMMANDS.dismiss, () => this.dismiss()),
			vscode.workspace.onDidChangeConfiguration((e) => this.onConfigurationChanged(e)),
			vscode.window.onDidChangeActiveTextEditor(() => this.updateDecodingKey()),
			vscode.workspace.onDidCloseTextDocument((document) => this.answers.forget(document.uri.toString())),
			this.log.onDidChangeLogLevel(() => this.checkTrace()),
		);
		this.checkTrace();
	}

	private cycleDeps() {
		return {
			activeUri: () => vscode.window.activeTextEditor?.document.uri.toString(),
			decoding: this.decoding,
			timeoutMs: () => this.settings.deadlineMs,
			run: (command: string) => vscode.commands.executeCommand(command),
		};
	}

	/** Escape while the active document decodes (bound on the same context key): hide the
	 * suggestion, as VS Code's own Escape does, and keep the decoding's notifications from showing
	 * it again at this text. */
	private async dismiss(): Promise<void> {
		const document = vscode.window.activeTextEditor?.document;
		if (document !== undefined) {
			this.answers.dismissed(document.uri.toString(), document.version);
		}
		await vscode.commands.executeCommand(HIDE_INLINE_SUGGEST);
	}

	/** The context key that binds Alt+] / Alt+[ (and Escape) to kspec.showNext / kspec.showPrevious (kspec.dismiss). */
	private updateDecodingKey(): void {
		const uri = vscode.window.activeTextEditor?.document.uri.toString();
		const decoding = uri !== undefined && this.decoding.has(uri);
		if (decoding !== this.decodingKey) {
			this.decodingKey = decoding;
			void vscode.commands.executeCommand('setContext', DECODING_CONTEXT_KEY, decoding);
		}
	}

	/** vscode-languageclient traces only into a channel at log level Trace: say so where it is not. */
	private checkTrace(): void {
		const trace = vscode.workspace.getConfiguration('kspec').get<string>('trace.server', 'off');
		if (trace !== 'off' && this.log.logLevel !== vscode.LogLevel.Trace) {
			this.log.warn(`kspec.trace.server is "${trace}", but the LSP traffic is logged only at log level Trace: ` +
				'run "Developer: Set Log Level…", pick "kspec", then "Trace".');
		}
	}

	start(): Promise<void> {
		return this.enqueue(() => this.startNow());
	}

	async dispose(): Promise<void> {
		await this.enqueue(() => this.stopNow());
		for (const d of this.disposables) {
			d.dispose();
		}
	}

	private workspaceFolders(): string[] {
		return (vscode.workspace.workspaceFolders ?? []).filter((f) => f.uri.scheme === 'file').map((f) => f.uri.fsPath);
	}

	private read(): KspecSettings {
		const { settings, problems } = readSettings(vscode.workspace.getConfiguration('kspec'), defaultPathContext(this.workspaceFolders()[0]));
		for (const p of problems) {
			this.log.warn(p);
		}
		return settings;
	}

	/** This output channel (kspec lsp's stderr), and the engine daemon's log file when the
	 * server said where it is (the daemon serves every editor; its messages are not here). */
	private async showLog(): Promise<void> {
		this.log.show(true);
		const engineLog = this.status.engineLog;
		if (engineLog === undefined) {
			return;
		}
		try {
			const document = await vscode.workspace.openTextDocument(vscode.Uri.file(engineLog));
			await vscode.window.showTextDocument(document, { preview: true, preserveFocus: false });
		} catch (err) {
			this.log.warn(`cannot open the engine log ${engineLog}: ${String(err)}`);
		}
	}

	private render(): void {
		const view = this.status.view();
		this.item.text = view.text;
		this.item.tooltip = view.tooltip;
		this.item.command = view.command;
		this.item.backgroundColor =
			view.severity === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground')
				: view.severity === 'warning' ? new vscode.ThemeColor('statusBarItem.warningBackground')
					: undefined;
	}

	private enqueue(job: () => Promise<void>): Promise<void> {
		this.queue = this.queue.then(job, job).catch((err) => this.log.error(`kspec: ${String(err)}`));
		return this.queue;
	}

	private clientOptions(): LanguageClientOptions {
		return {
			// Every text document; the language filter is applied per request (below and in
			// the server), so that changing kspec.languages needs no restart.
			documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
			outputChannel: this.log,
			revealOutputChannelOn: RevealOutputChannelOn.Never,
			initializationOptions: () => toServerSettings(this.settings),
			middleware: {
				provideInlineCompletionItems: async (document, position, context, token, next) => {
					if (!shouldComplete(this.settings, document.languageId)) {
						return undefined;
					}
					const version = document.version;
					const result = await next(document, position, context, token);
					if (!token.isCancellationRequested) {
						this.answers.answered(document.uri.toString(), version, hasItems(result));
					}
					return result;
				},
				// The completion list is the fallback for editors without inline completion;
				// VS Code has it, and the same text in the suggest widget would be noise.
				provideCompletionItem: () => undefined,
				workspace: {
					// If the server pulls its settings, give it the same flat object.
					configuration: async (params, token, next) => {
						const result = await next(params, token);
						if (!Array.isArray(result)) {
							return result;
						}
						return params.items.map((item, i) => (item.section === 'kspec' ? toServerSettings(this.settings) : result[i]));
					},
				},
			},
		};
	}

	private async startNow(): Promise<void> {
		this.status.setPhase('starting');
		this.render();
		const resolved = resolveServerCommand(this.settings, {
			platform: process.platform,
			env: process.env,
			home: os.homedir(),
			workspaceFolders: this.workspaceFolders(),
			pythonInterpreter: vscode.workspace.getConfiguration('python').get<string>('defaultInterpreterPath'),
			isExecutable: defaultIsExecutable,
		});
		if (!resolved.ok) {
			this.fail(resolved.error);
			return;
		}
		const cmd = resolved.value;
		this.log.info(`starting ${cmd.command} ${cmd.args.join(' ')} (${cmd.source})`);
		const exe = toExecutable(cmd);
		const client = new LanguageClient('kspec', 'kspec', { run: exe, debug: exe }, this.clientOptions());
		client.registerFeature(declareSuggestionsUpdated);
		client.onNotification(STATUS_METHOD, (raw: unknown) => {
			const params = parseStatus(raw);
			if (params === undefined) {
				this.log.warn(`ignored a malformed ${STATUS_METHOD}: ${JSON.stringify(raw)}`);
				return;
			}
			if (params.state === 'error') {
				this.log.error(`server: ${params.message}`);
			}
			this.status.onServerStatus(params);
			this.decoding.update(params.decoding ?? []);
			this.updateDecodingKey();
			this.render();
		});
		// Longer alternatives are ready for the text being edited: hide and ask again (served
		// from the server's typeahead cache), so the suggestion on screen grows without a keystroke.
		client.onNotification(SUGGESTIONS_UPDATED_METHOD, suggestionsUpdatedHandler({
			activeDocument: () => {
				const editor = vscode.window.activeTextEditor;
				return editor && {
					uri: editor.document.uri.toString(), version: editor.document.version,
					languageId: editor.document.languageId, selectionEmpty: editor.selection.isEmpty,
				};
			},
			settings: () => this.settings,
			trigger: () => void showAgain((command) => vscode.commands.executeCommand(command)),
			warn: (message) => this.log.warn(message),
			decoding: this.decoding,
			answers: this.answers,
		}));
		client.onDidChangeState((e) => {
			if (e.newState === State.Running) {
				this.status.setPhase('running');
			} else if (e.newState === State.Starting) {
				this.status.setPhase('starting');
			} else if (e.newState === State.Stopped && !this.stopping) {
				this.status.setPhase('stopped', 'the process exited');
			}
			this.render();
		});
		this.client = client;
		try {
			await client.start();
		} catch (err) {
			this.fail(err instanceof Error ? err.message : String(err));
		}
	}

	private fail(message: string): void {
		this.log.error(message);
		this.status.setPhase('failed', message);
		this.render();
		void vscode.window.showErrorMessage(`kspec: ${message}`, 'Show log', 'Open settings').then((choice) => {
			if (choice === 'Show log') {
				void this.showLog();
			} else if (choice === 'Open settings') {
				void vscode.commands.executeCommand('workbench.action.openSettings', SETTINGS_FILTER);
			}
		});
	}

	private async stopNow(): Promise<void> {
		const client = this.client;
		this.client = undefined;
		if (client === undefined) {
			return;
		}
		this.stopping = true;
		try {
			if (client.isRunning()) {
				await client.stop(5000);
			}
			await client.dispose();
		} catch (err) {
			this.log.warn(`stopping the server: ${String(err)}`);
		} finally {
			this.stopping = false;
		}
	}

	private async restartNow(): Promise<void> {
		await this.stopNow();
		this.settings = this.read();
		this.status.setEnabled(this.settings.enabled);
		await this.startNow();
	}

	private async toggle(): Promise<void> {
		const cfg = vscode.workspace.getConfiguration('kspec');
		const where = cfg.inspect<boolean>('enabled');
		const target = where?.workspaceFolderValue !== undefined || where?.workspaceValue !== undefined
			? vscode.ConfigurationTarget.Workspace
			: vscode.ConfigurationTarget.Global;
		// onConfigurationChanged does the rest (server, status bar).
		await cfg.update('enabled', !this.settings.enabled, target);
	}

	private onConfigurationChanged(e: vscode.ConfigurationChangeEvent): void {
		if (!e.affectsConfiguration('kspec')) {
			return;
		}
		if (e.affectsConfiguration('kspec.trace.server')) {
			this.checkTrace();
		}
		const before = this.settings;
		this.settings = this.read();
		this.status.setEnabled(this.settings.enabled);
		this.render();
		if (needsRestart(before, this.settings)) {
			void this.enqueue(() => this.restartNow());
			return;
		}
		const client = this.client;
		if (client?.isRunning()) {
			client
				.sendNotification(DidChangeConfigurationNotification.type, { settings: toServerSettings(this.settings) })
				.catch((err) => this.log.warn(`sending settings: ${String(err)}`));
		}
	}
}

let extension: KspecExtension | undefined;

export function activate(_context: vscode.ExtensionContext): void {
	extension = new KspecExtension();
	// Not awaited: loading Python and the model can take seconds; the status bar shows it.
	void extension.start();
}

export async function deactivate(): Promise<void> {
	const ext = extension;
	extension = undefined;
	await ext?.dispose();
}
