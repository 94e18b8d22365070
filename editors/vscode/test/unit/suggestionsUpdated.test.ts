import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DEFAULTS } from '../../src/settings';
import {
	ActiveDocument,
	Answers,
	declareSuggestionsUpdated,
	hasItems,
	parseSuggestionsUpdated,
	shouldRetrigger,
	suggestionsUpdatedHandler,
	SUGGESTIONS_UPDATED_METHOD,
	TRIGGER_INLINE_SUGGEST,
} from '../../src/suggestionsUpdated';

const URI = 'file:///proj/example.py';
const editing = (over: Partial<ActiveDocument> = {}): ActiveDocument => ({ uri: URI, version: 7, languageId: 'python', selectionEmpty: true, ...over });

describe('parseSuggestionsUpdated', () => {
	it('accepts the shape the server sends', () => {
		assert.equal(SUGGESTIONS_UPDATED_METHOD, '$/kspec/suggestionsUpdated');
		assert.deepEqual(parseSuggestionsUpdated({ uri: URI, version: 7 }), { uri: URI, version: 7 });
		assert.deepEqual(parseSuggestionsUpdated({ uri: URI, version: 0, extra: true }), { uri: URI, version: 0 });
	});
	it('rejects what is not one', () => {
		for (const bad of [null, undefined, 'x', 3, [], {}, { uri: URI }, { version: 7 }, { uri: '', version: 7 }, { uri: URI, version: '7' }, { uri: URI, version: 7.5 }, { uri: 1, version: 7 }]) {
			assert.equal(parseSuggestionsUpdated(bad), undefined, JSON.stringify(bad));
		}
	});
});

describe('shouldRetrigger', () => {
	const params = { uri: URI, version: 7 };
	it('asks again for the document being edited at that version', () => {
		assert.equal(shouldRetrigger(params, editing(), DEFAULTS), true);
	});
	it('not after a further edit, in another document, with a selection or without an editor', () => {
		assert.equal(shouldRetrigger(params, editing({ version: 8 }), DEFAULTS), false);
		assert.equal(shouldRetrigger(params, editing({ version: 6 }), DEFAULTS), false);
		assert.equal(shouldRetrigger(params, editing({ uri: 'file:///proj/other.py' }), DEFAULTS), false);
		assert.equal(shouldRetrigger(params, editing({ selectionEmpty: false }), DEFAULTS), false);
		assert.equal(shouldRetrigger(params, undefined, DEFAULTS), false);
	});
	it('not when completions are off, or off for that language', () => {
		assert.equal(shouldRetrigger(params, editing(), { ...DEFAULTS, enabled: false }), false);
		assert.equal(shouldRetrigger(params, editing(), { ...DEFAULTS, languages: ['go'] }), false);
		assert.equal(shouldRetrigger(params, editing(), { ...DEFAULTS, languages: ['go', 'python'] }), true);
	});
});

describe('suggestionsUpdatedHandler', () => {
	function setup(active: ActiveDocument | undefined) {
		const calls = { trigger: 0, warnings: [] as string[] };
		const handler = suggestionsUpdatedHandler({
			activeDocument: () => active,
			settings: () => DEFAULTS,
			trigger: () => { calls.trigger += 1; },
			warn: (message) => { calls.warnings.push(message); },
		});
		return { handler, calls };
	}
	it('runs the trigger command once per matching notification', () => {
		assert.equal(TRIGGER_INLINE_SUGGEST, 'editor.action.inlineSuggest.trigger');
		const { handler, calls } = setup(editing());
		handler({ uri: URI, version: 7 });
		assert.equal(calls.trigger, 1);
		handler({ uri: URI, version: 6 });
		assert.equal(calls.trigger, 1);
		assert.deepEqual(calls.warnings, []);
	});
	it('logs and ignores a malformed one', () => {
		const { handler, calls } = setup(editing());
		handler({ uri: URI });
		assert.equal(calls.trigger, 0);
		assert.equal(calls.warnings.length, 1);
		assert.match(calls.warnings[0], /malformed \$\/kspec\/suggestionsUpdated/);
	});
});

describe('declareSuggestionsUpdated', () => {
	it('declares the notification in the client capabilities, keeping other experimental ones', () => {
		const capabilities: { experimental?: unknown } = { experimental: { other: 1 } };
		declareSuggestionsUpdated.fillClientCapabilities(capabilities);
		assert.deepEqual(capabilities.experimental, { other: 1, kspec: { suggestionsUpdated: true } });
		const bare: { experimental?: unknown } = {};
		declareSuggestionsUpdated.fillClientCapabilities(bare);
		assert.deepEqual(bare.experimental, { kspec: { suggestionsUpdated: true } });
	});
});

describe('typed into the suggestion since the request', () => {
	// the request was at version 7; the user typed two characters of the ghost (versions 8, 9),
	// each answered from the server's typeahead cache
	const params = { uri: URI, version: 7, final: true };
	it('asks again when the answer VS Code holds was asked at the text now and had items', () => {
		assert.equal(shouldRetrigger(params, editing({ version: 9 }), DEFAULTS, { version: 9, items: true }), true);
	});
	it('not when that answer is older than the text (typed on: a request of its own), empty, or unknown', () => {
		assert.equal(shouldRetrigger(params, editing({ version: 9 }), DEFAULTS, { version: 8, items: true }), false);
		assert.equal(shouldRetrigger(params, editing({ version: 9 }), DEFAULTS, { version: 9, items: false }), false);
		assert.equal(shouldRetrigger(params, editing({ version: 9 }), DEFAULTS, undefined), false);
	});
	it('never for a document newer than the notification in another editor, with a selection, or off', () => {
		const last = { version: 9, items: true };
		assert.equal(shouldRetrigger(params, editing({ version: 9, uri: 'file:///proj/other.py' }), DEFAULTS, last), false);
		assert.equal(shouldRetrigger(params, editing({ version: 9, selectionEmpty: false }), DEFAULTS, last), false);
		assert.equal(shouldRetrigger(params, editing({ version: 9 }), { ...DEFAULTS, enabled: false }, last), false);
		assert.equal(shouldRetrigger({ uri: URI, version: 10 }, editing({ version: 9 }), DEFAULTS, last), false);
	});
	it('the handler reads the answers it is given', () => {
		const answers = new Answers();
		let triggers = 0;
		const handler = suggestionsUpdatedHandler({
			activeDocument: () => editing({ version: 9 }),
			settings: () => DEFAULTS,
			trigger: () => { triggers += 1; },
			warn: () => undefined,
			answers,
		});
		handler(params);
		assert.equal(triggers, 0); // no answer at version 9 yet
		answers.answered(URI, 9, true);
		handler(params);
		assert.equal(triggers, 1);
	});
});

describe('dismissed with Escape', () => {
	const params = { uri: URI, version: 7 };
	it('no notification shows it again at that text, until VS Code asks again', () => {
		const answers = new Answers();
		answers.answered(URI, 7, true);
		answers.dismissed(URI, 7);
		assert.deepEqual(answers.get(URI), { version: 7, items: true, dismissed: true });
		assert.equal(shouldRetrigger(params, editing(), DEFAULTS, answers.get(URI)), false);
		assert.equal(shouldRetrigger({ ...params, final: true }, editing(), DEFAULTS, answers.get(URI)), false);
		answers.answered(URI, 7, true); // asked again by hand at the same text
		assert.equal(shouldRetrigger(params, editing(), DEFAULTS, answers.get(URI)), true);
	});
	it('a dismissal at an older text does not hold at the text now', () => {
		const answers = new Answers();
		answers.dismissed(URI, 7);
		assert.deepEqual(answers.get(URI), { version: 7, items: false, dismissed: true });
		answers.answered(URI, 9, true); // typed on: VS Code asked at each key
		assert.equal(shouldRetrigger(params, editing({ version: 9 }), DEFAULTS, answers.get(URI)), true);
	});
	it('the handler does not trigger after a dismissal', () => {
		const answers = new Answers();
		let triggers = 0;
		const handler = suggestionsUpdatedHandler({
			activeDocument: () => editing(),
			settings: () => DEFAULTS,
			trigger: () => { triggers += 1; },
			warn: () => undefined,
			answers,
		});
		answers.answered(URI, 7, true);
		handler(params);
		assert.equal(triggers, 1);
		answers.dismissed(URI, 7);
		handler(params);
		handler({ ...params, final: true });
		assert.equal(triggers, 1);
	});
});

describe('Answers', () => {
	it('keeps the newest version per document, forgets a closed one', () => {
		const answers = new Answers();
		answers.answered(URI, 8, true);
		answers.answered(URI, 9, false);
		answers.answered(URI, 8, true); // a late answer to an older request
		assert.deepEqual(answers.get(URI), { version: 9, items: false });
		answers.answered(URI, 9, true); // asked again at the same version
		assert.deepEqual(answers.get(URI), { version: 9, items: true });
		answers.forget(URI);
		assert.equal(answers.get(URI), undefined);
	});
	it('hasItems reads a list, an array or nothing', () => {
		assert.equal(hasItems({ items: [{ insertText: 'x' }] }), true);
		assert.equal(hasItems({ items: [] }), false);
		assert.equal(hasItems([{ insertText: 'x' }]), true);
		assert.equal(hasItems([]), false);
		assert.equal(hasItems(null), false);
		assert.equal(hasItems(undefined), false);
	});
});
