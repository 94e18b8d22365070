// `$/kspec/suggestionsUpdated`: the server answered a request early (what was complete at
// its first deadline), kept decoding, and has now stored the longer alternatives in its
// typeahead cache for that document at that version. If the user is still looking at that
// text, asking again shows them at once (the new request is answered from the cache): VS Code
// is told to hide what it shows and ask again (a trigger alone, at the place and version of
// what it shows, is answered from what it holds: the ghost would not change). Every
// notification does so, also after Alt+]. `final` says that the decoding is over.
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

/** Ask again only for the document being edited, still at that version, with a cursor (not a
 * selection), and completions on for its language. */
export function shouldRetrigger(params: SuggestionsUpdatedParams, active: ActiveDocument | undefined, settings: ServerSettings): boolean {
	return (
		active !== undefined &&
		active.uri === params.uri &&
		active.version === params.version &&
		active.selectionEmpty &&
		shouldComplete(settings, active.languageId)
	);
}

export interface SuggestionsUpdatedDeps {
	activeDocument(): ActiveDocument | undefined;
	settings(): ServerSettings;
	/** Hides the inline suggestion and triggers it again (decoding.ts: showAgain). */
	trigger(): void;
	warn(message: string): void;
	/** The documents still decoding; a final notification ends one (and the waits on it). */
	decoding?: DecodingDocuments;
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
		if (!joined && shouldRetrigger(params, deps.activeDocument(), deps.settings())) {
			deps.trigger();
		}
	};
}
