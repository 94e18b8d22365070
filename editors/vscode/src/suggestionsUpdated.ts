// `$/kspec/suggestionsUpdated`: the server answered a request early (what was complete at
// its first deadline), kept decoding, and has now stored the longer alternatives in its
// typeahead cache for that document at that version. If the user is still looking at that
// text, asking again shows them at once (the new request is answered from the cache): VS Code
// is told to hide what it shows and ask again (a trigger alone, at the place and version of
// what it shows, is answered from what it holds: the ghost would not change). Every
// notification does so, also after Alt+]. `final` says that the decoding is over.
// The user may have typed into the suggestion since: VS Code asked at each key and the cache
// answered for the text as typed (the server keeps decoding a request only while every later
// request for the document is answered so; any other supersedes it). The notification still
// names the request's version; asking again is then answered from the cache for the text now,
// as in the Neovim plugin (seen in code-server: typing "it" into "item in self.items", the
// ghost stayed at the early answer, the two lines decoded after it came only with a key).
// No `vscode` import: extension.ts supplies the active editor and runs the commands.

import { DecodingDocuments } from './decoding';
import { ServerSettings, shouldComplete } from './settings';

export { TRIGGER_INLINE_SUGGEST } from './decoding';
export const SUGGESTIONS_UPDATED_METHOD = '$/kspec/suggestionsUpdated';

/** Declares in the client capabilities that this client handles SUGGESTIONS_UPDATED_METHOD:
 * only then does the server answer early with what is complete and tell us when more is. */
export const declareSuggestionsUpdated = {
	fillClientCapabilities(capabilities: { experimental?: unknown }): void {
		const experimental = (typeof capabilities.experimental === 'object' && capabilities.experimental !== null ? capabilities.experimental : {}) as Record<string, unknown>;
		capabilities.experimental = { ...experimental, kspec: { suggestionsUpdated: true } };
	},
	initialize(): void { /* nothing to set up */ },
	getState(): { kind: 'static' } { return { kind: 'static' }; },
	clear(): void { /* nothing to clear */ },
};

export interface SuggestionsUpdatedParams {
	uri: string;
	version: number;
	/** The decoding for them is over (absent: not said, taken as not final). */
	final?: boolean;
}

/** Validate a notification's params; undefined for anything malformed (logged, ignored). */
export function parseSuggestionsUpdated(raw: unknown): SuggestionsUpdatedParams | undefined {
	if (typeof raw !== 'object' || raw === null) {
		return undefined;
	}
	const r = raw as Record<string, unknown>;
	if (typeof r.uri !== 'string' || r.uri === '' || typeof r.version !== 'number' || !Number.isInteger(r.version)) {
		return undefined;
	}
	return typeof r.final === 'boolean' ? { uri: r.uri, version: r.version, final: r.final } : { uri: r.uri, version: r.version };
}

/** What the user is looking at: the active text editor's document and cursor. */
export interface ActiveDocument {
	/** `document.uri.toString()`, as vscode-languageclient sends it to the server. */
	uri: string;
	/** `document.version`, as sent in didOpen / didChange. */
	version: number;
	languageId: string;
	/** No text selected: a cursor, where inline suggestions show. */
	selectionEmpty: boolean;
}

/** The last inline completion answer VS Code got for each document (the provider middleware
 * records it): the document version it was asked at, whether it had items, and whether the
 * user dismissed it (Escape while the document decodes: kspec.dismiss). */
export interface Answer {
	version: number;
	items: boolean;
	dismissed?: boolean;
}

export class Answers {
	private readonly last = new Map<string, Answer>();

	/** An answer came (not cancelled) for `uri` asked at `version`. */
	answered(uri: string, version: number, items: boolean): void {
		const before = this.last.get(uri);
		if (before === undefined || before.version <= version) {
			this.last.set(uri, { version, items });
		}
	}

	/** The user dismissed what VS Code shows for `uri` at `version`: no notification shows it
	 * again until VS Code asks again (a key, or a trigger by hand). */
	dismissed(uri: string, version: number): void {
		const before = this.last.get(uri);
		this.last.set(uri, { version, items: before?.version === version && before.items, dismissed: true });
	}

	get(uri: string): Answer | undefined {
		return this.last.get(uri);
	}

	forget(uri: string): void {
		this.last.delete(uri);
	}
}

/** Whether an inline completion result (a list, an array of items, or nothing) has items. */
export function hasItems(result: unknown): boolean {
	if (Array.isArray(result)) {
		return result.length > 0;
	}
	const items = (result as { items?: unknown } | null | undefined)?.items;
	return Array.isArray(items) && items.length > 0;
}

/** Ask again only for the document being edited, with a cursor (not a selection), and
 * completions on for its language, unless the user dismissed the suggestion at the text as it is
 * now; at the notification's version, or at a later one when the answer VS Code holds was asked
 * at the text as it is now and had items (typed into the suggestion since: the server's cache
 * answers for the text as typed). */
export function shouldRetrigger(params: SuggestionsUpdatedParams, active: ActiveDocument | undefined, settings: ServerSettings, last?: Answer): boolean {
	if (active === undefined || active.uri !== params.uri || !active.selectionEmpty || !shouldComplete(settings, active.languageId)) {
		return false;
	}
	if (last?.dismissed === true && last.version === active.version) {
		return false; // Escape: a suggestion that comes back by itself is one the user must dismiss twice
	}
	const typedInto = params.version < active.version && last !== undefined && last.version === active.version && last.items;
	return active.version === params.version || typedInto;
}

export interface SuggestionsUpdatedDeps {
	activeDocument(): ActiveDocument | undefined;
	settings(): ServerSettings;
	/** Hides the inline suggestion and triggers it again (decoding.ts: showAgain). */
	trigger(): void;
	warn(message: string): void;
	/** The documents still decoding; a final notification ends one (and the waits on it). */
	decoding?: DecodingDocuments;
	/** The last answers VS Code got, per document (asked again after typing into the suggestion). */
	answers?: Answers;
}

/** The notification handler extension.ts registers on its LanguageClient. */
export function suggestionsUpdatedHandler(deps: SuggestionsUpdatedDeps): (raw: unknown) => void {
	return (raw: unknown) => {
		const params = parseSuggestionsUpdated(raw);
		if (params === undefined) {
			deps.warn(`ignored a malformed ${SUGGESTIONS_UPDATED_METHOD}: ${JSON.stringify(raw)}`);
			return;
		}
		// Alt+] waiting for this document shows the final alternatives itself, once told.
		const joined = params.final === true && deps.decoding?.joining(params.uri) === true;
		if (params.final === true) {
			deps.decoding?.finished(params.uri);
		}
		if (!joined && shouldRetrigger(params, deps.activeDocument(), deps.settings(), deps.answers?.get(params.uri))) {
			deps.trigger();
		}
	};
}
