// A fake of the small part of the `vscode` module that our extension and
// vscode-languageclient touch, so that the real extension code (activate, the real
// LanguageClient, our middleware, status bar, commands, configuration handling) can
// run under node against the real `kspec lsp`. It is NOT VS Code: no editor, no
// rendering, no keybindings; providers are called directly by the test.
/* eslint-disable @typescript-eslint/no-explicit-any */

import * as path from 'node:path';
import { pathToFileURL, fileURLToPath } from 'node:url';

type Listener<T> = (e: T) => any;

export class Disposable {
	constructor(private readonly fn: () => void = () => undefined) {}
	static from(...items: { dispose(): any }[]): Disposable {
		return new Disposable(() => items.forEach((d) => d.dispose()));
	}
	dispose(): void {
		this.fn();
	}
}

export class EventEmitter<T> {
	private listeners = new Set<Listener<T>>();
	readonly event = (listener: Listener<T>, thisArg?: any): Disposable => {
		const bound = thisArg ? listener.bind(thisArg) : listener;
		this.listeners.add(bound);
		return new Disposable(() => this.listeners.delete(bound));
	};
	fire(e: T): void {
		for (const l of [...this.listeners]) {
			l(e);
		}
	}
	dispose(): void {
		this.listeners.clear();
	}
}

export class Position {
	constructor(readonly line: number, readonly character: number) {}
	isEqual(o: Position): boolean {
		return this.line === o.line && this.character === o.character;
	}
}

export class Range {
	readonly start: Position;
	readonly end: Position;
	constructor(a: any, b: any, c?: number, d?: number) {
		if (typeof a === 'number') {
			this.start = new Position(a, b);
			this.end = new Position(c!, d!);
		} else {
			this.start = a;
			this.end = b;
		}
	}
	get isEmpty(): boolean {
		return this.start.isEqual(this.end);
	}
}

export class Uri {
	private constructor(readonly scheme: string, readonly fsPath: string, private readonly text: string) {}
	static file(p: string): Uri {
		return new Uri('file', p, pathToFileURL(p).toString());
	}
	static parse(s: string): Uri {
		if (s.startsWith('file:')) {
			return new Uri('file', fileURLToPath(s), s);
		}
		return new Uri(s.split(':')[0], '', s);
	}
	get path(): string {
		return this.fsPath;
	}
	toString(): string {
		return this.text;
	}
	with(): Uri {
		return this;
	}
}

export class InlineCompletionItem {
	constructor(public insertText: any, public range?: Range, public command?: any) {}
}

export class InlineCompletionList {
	constructor(public items: InlineCompletionItem[]) {}
}

export enum InlineCompletionTriggerKind { Invoke = 0, Automatic = 1 }
export enum StatusBarAlignment { Left = 1, Right = 2 }
export enum ConfigurationTarget { Global = 1, Workspace = 2, WorkspaceFolder = 3 }
export enum LogLevel { Off = 0, Trace = 1, Debug = 2, Info = 3, Warning = 4, Error = 5 }
export enum TextDocumentSaveReason { Manual = 1, AfterDelay = 2, FocusOut = 3 }
export enum UIKind { Desktop = 1, Web = 2 }

export class ThemeColor {
	constructor(readonly id: string) {}
}

export class CancellationError extends Error {}

export class CancellationTokenSource {
	private emitter = new EventEmitter<void>();
	token = { isCancellationRequested: false, onCancellationRequested: this.emitter.event };
	cancel(): void {
		this.token.isCancellationRequested = true;
		this.emitter.fire();
	}
	dispose(): void {
		this.emitter.dispose();
	}
}

/** A plain class for every other name the client library extends or constructs. */
function plainClass(name: string): any {
	const C = class {
		constructor(...args: any[]) {
			(this as any).args = args;
		}
	};
	Object.defineProperty(C, 'name', { value: name });
	return C;
}

const OTHER_CLASSES = [
	'CallHierarchyIncomingCall', 'CallHierarchyItem', 'CallHierarchyOutgoingCall', 'CodeAction', 'CodeActionKind', 'CodeLens', 'Color',
	'ColorInformation', 'ColorPresentation', 'CompletionItem', 'CompletionList', 'Diagnostic', 'DiagnosticRelatedInformation',
	'DocumentHighlight', 'DocumentLink', 'DocumentSymbol', 'FoldingRange', 'Hover', 'InlayHint', 'InlayHintLabelPart',
	'InlineValueEvaluatableExpression', 'InlineValueText', 'InlineValueVariableLookup', 'LinkedEditingRanges', 'Location',
	'MarkdownString', 'ParameterInformation', 'RelativePattern', 'SelectionRange', 'SemanticTokens', 'SemanticTokensEdit',
	'SemanticTokensEdits', 'SignatureHelp', 'SignatureInformation', 'SnippetString', 'SnippetTextEdit', 'SymbolInformation',
	'TabInputCustom', 'TabInputNotebook', 'TabInputText', 'TabInputTextDiff', 'TextEdit', 'TypeHierarchyItem', 'WorkspaceEdit',
];
const ENUMS = [
	'CodeActionTriggerKind', 'CompletionItemKind', 'CompletionItemTag', 'CompletionTriggerKind', 'DiagnosticSeverity', 'DiagnosticTag',
	'DocumentHighlightKind', 'FileType', 'FoldingRangeKind', 'NotebookCellKind', 'ProgressLocation', 'SignatureHelpTriggerKind',
	'SymbolKind', 'SymbolTag',
];

export interface FakeDocument {
	uri: Uri;
	fileName: string;
	languageId: string;
	version: number;
	isClosed: boolean;
	isUntitled: boolean;
	lineCount: number;
	getText(): string;
	save(): Promise<boolean>;
}

export function makeDocument(file: string, languageId: string, text: string): FakeDocument {
	return {
		uri: Uri.file(file), fileName: file, languageId, version: 1, isClosed: false, isUntitled: false,
		lineCount: text.split('\n').length, getText: () => text, save: async () => true,
	};
}

export interface StatusItem {
	text: string;
	tooltip: any;
	command: any;
	backgroundColor: ThemeColor | undefined;
	name?: string;
	visible: boolean;
	show(): void;
	hide(): void;
	dispose(): void;
}

/** Build a fresh fake `vscode` module plus handles for the test. */
export function createFakeVscode(workspaceFolders: string[], initialSettings: Record<string, unknown>) {
	const settings: Record<string, unknown> = { ...initialSettings };
	const configChanged = new EventEmitter<{ affectsConfiguration(section: string): boolean }>();
	const commands = new Map<string, (...a: any[]) => any>();
	const inlineProviders: { selector: any; provider: any }[] = [];
	const completionProviders: { selector: any; provider: any }[] = [];
	const statusItems: StatusItem[] = [];
	const log: string[] = [];
	const errors: string[] = [];
	const docOpened = new EventEmitter<FakeDocument>();
	const textDocuments: FakeDocument[] = [];
	const noEvent = (_l: any) => new Disposable();

	function section(name: string) {
		const prefix = name ? name + '.' : '';
		return {
			get: <T>(key: string, dflt?: T): T | undefined => (prefix + key in settings ? (settings[prefix + key] as T) : dflt),
			has: (key: string) => prefix + key in settings,
			inspect: (key: string) => ({ key: prefix + key, globalValue: settings[prefix + key] }),
			update: async (key: string, value: unknown) => {
				settings[prefix + key] = value;
				const full = prefix + key;
				configChanged.fire({ affectsConfiguration: (s: string) => full === s || full.startsWith(s + '.') });
			},
		};
	}

	const channel = (name: string) => {
		const write = (level: string) => (msg: string) => log.push(`[${name} ${level}] ${msg}`);
		return {
			name, logLevel: LogLevel.Info, onDidChangeLogLevel: noEvent,
			append: write('append'), appendLine: write('line'), replace: write('replace'), clear: () => undefined,
			show: () => undefined, hide: () => undefined, dispose: () => undefined,
			trace: write('trace'), debug: write('debug'), info: write('info'), warn: write('warn'), error: write('error'),
		};
	};

	const languageMatches = (selector: any, doc: FakeDocument): number => {
		const filters = Array.isArray(selector) ? selector : [selector];
		return filters.some((f: any) =>
			typeof f === 'string' ? f === doc.languageId
				: (!f.language || f.language === doc.languageId) && (!f.scheme || f.scheme === doc.uri.scheme)) ? 10 : 0;
	};

	const vscode: Record<string, any> = {
		version: '1.91.0',
		Disposable, EventEmitter, Position, Range, Uri, InlineCompletionItem, InlineCompletionList, InlineCompletionTriggerKind,
		StatusBarAlignment, ConfigurationTarget, LogLevel, TextDocumentSaveReason, UIKind, ThemeColor, CancellationError,
		CancellationTokenSource,
		env: { appName: 'fake-vscode', language: 'en', machineId: 'test', uiKind: UIKind.Desktop, openExternal: async () => true },
		window: {
			createOutputChannel: (name: string) => channel(name),
			createStatusBarItem: () => {
				const item: StatusItem = {
					text: '', tooltip: undefined, command: undefined, backgroundColor: undefined, visible: false,
					show() { item.visible = true; }, hide() { item.visible = false; }, dispose() { item.visible = false; },
				};
				statusItems.push(item);
				return item;
			},
			showErrorMessage: async (msg: string) => { errors.push(msg); return undefined; },
			showWarningMessage: async (msg: string) => { log.push(`[warning message] ${msg}`); return undefined; },
			showInformationMessage: async (msg: string) => { log.push(`[info message] ${msg}`); return undefined; },
			showTextDocument: async () => undefined,
			activeTextEditor: undefined,
			visibleTextEditors: [],
			onDidChangeVisibleTextEditors: noEvent,
			onDidChangeActiveTextEditor: noEvent,
			tabGroups: { all: [], onDidChangeTabs: noEvent, onDidChangeTabGroups: noEvent },
			withProgress: async (_o: any, task: any) => task({ report: () => undefined }, new CancellationTokenSource().token),
		},
		workspace: {
			workspaceFolders: workspaceFolders.map((p, index) => ({ uri: Uri.file(p), name: path.basename(p), index })),
			name: 'test',
			textDocuments,
			notebookDocuments: [],
			getConfiguration: (name = '') => section(name),
			onDidChangeConfiguration: configChanged.event,
			onDidOpenTextDocument: docOpened.event,
			onDidCloseTextDocument: noEvent, onDidChangeTextDocument: noEvent, onDidSaveTextDocument: noEvent,
			onWillSaveTextDocument: noEvent, onDidChangeWorkspaceFolders: noEvent,
			onDidOpenNotebookDocument: noEvent, onDidCloseNotebookDocument: noEvent, onDidChangeNotebookDocument: noEvent,
			onDidSaveNotebookDocument: noEvent, onDidCreateFiles: noEvent, onDidRenameFiles: noEvent, onDidDeleteFiles: noEvent,
			onWillCreateFiles: noEvent, onWillRenameFiles: noEvent, onWillDeleteFiles: noEvent,
			createFileSystemWatcher: () => ({ onDidCreate: noEvent, onDidChange: noEvent, onDidDelete: noEvent, dispose: () => undefined }),
			applyEdit: async () => true,
			getWorkspaceFolder: () => undefined,
			registerTextDocumentContentProvider: () => new Disposable(),
		},
		languages: {
			match: languageMatches,
			registerInlineCompletionItemProvider: (selector: any, provider: any) => {
				const entry = { selector, provider };
				inlineProviders.push(entry);
				return new Disposable(() => inlineProviders.splice(inlineProviders.indexOf(entry), 1));
			},
			registerCompletionItemProvider: (selector: any, provider: any) => {
				const entry = { selector, provider };
				completionProviders.push(entry);
				return new Disposable(() => completionProviders.splice(completionProviders.indexOf(entry), 1));
			},
			createDiagnosticCollection: () => ({ set: () => undefined, delete: () => undefined, clear: () => undefined, dispose: () => undefined }),
		},
		commands: {
			registerCommand: (id: string, fn: (...a: any[]) => any) => {
				commands.set(id, fn);
				return new Disposable(() => commands.delete(id));
			},
			executeCommand: async (id: string, ...args: any[]) => commands.get(id)?.(...args),
		},
		extensions: { getExtension: () => undefined, all: [] },
	};
	for (const name of OTHER_CLASSES) {
		vscode[name] = plainClass(name);
	}
	for (const name of ENUMS) {
		vscode[name] = {};
	}
	// Anything else the library reads at start-up: a no-op registration.
	for (const [ns, obj] of Object.entries({ languages: vscode.languages, window: vscode.window, workspace: vscode.workspace })) {
		vscode[ns] = new Proxy(obj, {
			get(target: any, prop: string | symbol) {
				if (prop in target || typeof prop === 'symbol') {
					return target[prop];
				}
				if (prop.startsWith('register') || prop.startsWith('onDid') || prop.startsWith('onWill')) {
					return () => new Disposable();
				}
				return undefined;
			},
		});
	}

	return {
		vscode,
		settings,
		commands,
		inlineProviders,
		completionProviders,
		statusItems,
		log,
		errors,
		openDocument(doc: FakeDocument) {
			textDocuments.push(doc);
			docOpened.fire(doc);
		},
		async setSetting(key: string, value: unknown) {
			await section('').update(key, value);
		},
	};
}
