import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DEFAULTS } from '../../src/settings';
import { SETTINGS_FILTER } from '../../src/status';
import {
	cycle, DecodingDocuments, GRACE_MS, HIDE_INLINE_SUGGEST, SHOW_NEXT_INLINE_SUGGEST, SHOW_PREVIOUS_INLINE_SUGGEST, showAgain, TRIGGER_INLINE_SUGGEST,
} from '../../src/decoding';
import { suggestionsUpdatedHandler } from '../../src/suggestionsUpdated';

const URI = 'file:///proj/example.py';
const manifest = require('../../../package.json');

describe('showAgain', () => {
	it('hides, then triggers: VS Code asks the provider again and shows the new first alternative', async () => {
		const ran: string[] = [];
		await showAgain(async (command) => { ran.push(command); });
		assert.deepEqual(ran, [HIDE_INLINE_SUGGEST, TRIGGER_INLINE_SUGGEST]);
	});
});

describe('DecodingDocuments', () => {
	it('a wait ends at once when not decoding, at a final notification, or at its timeout', async () => {
		const d = new DecodingDocuments();
		assert.equal(await d.wait(URI, 10_000), true);
		d.update([URI]);
		assert.equal(d.has(URI), true);
		const waiting = d.wait(URI, 10_000);
		assert.equal(d.joining(URI), true);
		d.finished(URI);
		assert.equal(await waiting, true);
		assert.equal(d.joining(URI), false);
		d.update([URI]);
		assert.equal(await d.wait(URI, 5), false);
		assert.equal(d.joining(URI), false);
	});
	it('a status without the document ends the wait a moment later (a final notification may follow it)', async () => {
		const d = new DecodingDocuments();
		d.update([URI]);
		const started = Date.now();
		const waiting = d.wait(URI, 10_000);
		d.update([]);
		assert.equal(d.joining(URI), true);
		assert.equal(await waiting, true);
		assert.ok(Date.now() - started >= GRACE_MS - 5);
	});
});

describe('cycle (Alt+] / Alt+[ while decoding)', () => {
	function deps(decoding: DecodingDocuments, uri: string | undefined = URI) {
		const ran: string[] = [];
		return { ran, deps: { activeUri: () => uri, decoding, timeoutMs: () => 10_000, run: async (c: string) => { ran.push(c); } } };
	}
	it('joins the decoding: waits for the final alternatives, shows them, then steps', async () => {
		const decoding = new DecodingDocuments();
		decoding.update([URI]);
		const { ran, deps: d } = deps(decoding);
		const handler = suggestionsUpdatedHandler({
			activeDocument: () => ({ uri: URI, version: 3, languageId: 'python', selectionEmpty: true }),
			settings: () => DEFAULTS, trigger: () => ran.push('retrigger'), warn: () => undefined, decoding,
		});
		const stepping = cycle(d, SHOW_NEXT_INLINE_SUGGEST);
		await new Promise((resolve) => setTimeout(resolve, 5));
		assert.deepEqual(ran, []); // still waiting
		handler({ uri: URI, version: 3, final: true }); // the join shows them, not the handler
		await stepping;
		assert.deepEqual(ran, [HIDE_INLINE_SUGGEST, TRIGGER_INLINE_SUGGEST, SHOW_NEXT_INLINE_SUGGEST]);
	});
	it('not decoding: VS Code\'s own step at once', async () => {
		const { ran, deps: d } = deps(new DecodingDocuments());
		await cycle(d, SHOW_PREVIOUS_INLINE_SUGGEST);
		assert.deepEqual(ran, [SHOW_PREVIOUS_INLINE_SUGGEST]);
	});
	it('an interim notification shows the grown alternatives every time', () => {
		const decoding = new DecodingDocuments();
		decoding.update([URI]);
		let shown = 0;
		const handler = suggestionsUpdatedHandler({
			activeDocument: () => ({ uri: URI, version: 3, languageId: 'python', selectionEmpty: true }),
			settings: () => DEFAULTS, trigger: () => { shown += 1; }, warn: () => undefined, decoding,
		});
		for (let i = 0; i < 4; i++) {
			handler({ uri: URI, version: 3, final: false });
		}
		handler({ uri: URI, version: 3, final: true });
		assert.equal(shown, 5);
		assert.equal(decoding.has(URI), false);
	});
});

describe('package.json wiring', () => {
	it('binds Alt+] / Alt+[ to the joining commands only while the active document decodes', () => {
		const bindings = manifest.contributes.keybindings as Array<{ command: string; key: string; when: string }>;
		for (const [command, key] of [['kspec.showNext', 'alt+]'], ['kspec.showPrevious', 'alt+[']]) {
			const binding = bindings.find((b) => b.command === command);
			assert.ok(binding, command);
			assert.equal(binding.key, key);
			assert.match(binding.when, /kspec\.activeDocumentDecoding/);
			assert.match(binding.when, /inlineSuggestionVisible/);
		}
	});
	it('"Open settings" filters by this extension, as @ext:<publisher>.<name>', () => {
		assert.equal(SETTINGS_FILTER, `@ext:${manifest.publisher}.${manifest.name}`);
	});
});
