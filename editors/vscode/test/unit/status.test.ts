import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { alternativesNote, COMMANDS, parseStatus, percent, StatusModel } from '../../src/status';

const ready = (lastLatencyMs: number | null, message = 'ready') => ({ state: 'ready' as const, message, progress: null, lastLatencyMs });

describe('parseStatus', () => {
	it('accepts the contract shape', () => {
		assert.deepEqual(parseStatus({ state: 'loading', message: 'loading model', progress: 0.25, lastLatencyMs: null }),
			{ state: 'loading', message: 'loading model', progress: 0.25, lastLatencyMs: null });
	});
	it('reads the latency as kspec lsp sends it (latencyMs) and the model name', () => {
		assert.deepEqual(parseStatus({ state: 'ready', message: 'ready', model: 'qwen', latencyMs: 41.5 }),
			{ state: 'ready', message: 'ready', progress: null, lastLatencyMs: 41.5, model: 'qwen' });
		assert.equal(parseStatus({ state: 'ready', lastLatencyMs: 7, latencyMs: 9 })?.lastLatencyMs, 7);
	});
	it('tolerates missing optional fields', () => {
		assert.deepEqual(parseStatus({ state: 'ready' }), { state: 'ready', message: '', progress: null, lastLatencyMs: null });
	});
	it('rejects what is not a status', () => {
		for (const bad of [null, undefined, 'ready', 42, [], {}, { state: 'READY' }, { state: 'done', message: 'x' }]) {
			assert.equal(parseStatus(bad), undefined, JSON.stringify(bad));
		}
	});
	it('drops non-finite numbers', () => {
		assert.deepEqual(parseStatus({ state: 'ready', progress: 'x', lastLatencyMs: Number.NaN }),
			{ state: 'ready', message: '', progress: null, lastLatencyMs: null });
	});
});

describe('StatusModel', () => {
	it('shows starting until the server says something', () => {
		const m = new StatusModel();
		assert.match(m.view().text, /loading~spin/);
		m.setPhase('running');
		assert.match(m.view().text, /loading~spin/);
		assert.equal(m.view().command, COMMANDS.toggle);
	});

	it('shows loading progress as a percentage', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus({ state: 'loading', message: 'dequantizing', progress: 0.424, lastLatencyMs: null });
		const v = m.view();
		assert.equal(v.text, '$(loading~spin) kspec 42%');
		assert.match(v.tooltip, /dequantizing 42%/);
		m.onServerStatus({ state: 'loading', message: 'loading', progress: null, lastLatencyMs: null });
		assert.equal(m.view().text, '$(loading~spin) kspec');
	});

	it('shows ready with the last latency, kept when a later ready has none', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus(ready(null));
		assert.equal(m.view().text, '$(check) kspec');
		m.onServerStatus(ready(123.6));
		assert.equal(m.view().text, '$(check) kspec 124 ms');
		m.onServerStatus(ready(null));
		assert.equal(m.view().text, '$(check) kspec 124 ms');
		m.onServerStatus(ready(12345));
		assert.equal(m.view().text, '$(check) kspec 12.3 s');
		assert.equal(m.view().severity, 'normal');
		m.onServerStatus({ ...ready(null), model: 'qwen2.5-coder' });
		assert.match(m.view().tooltip, /model qwen2\.5-coder/);
	});

	it('shows a server error with a click that opens the log', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus({ state: 'error', message: 'engine died', progress: null, lastLatencyMs: null });
		const v = m.view();
		assert.equal(v.text, '$(error) kspec');
		assert.equal(v.command, COMMANDS.showLog);
		assert.equal(v.severity, 'error');
		assert.match(v.tooltip, /engine died/);
		// and recovers when the server does
		m.onServerStatus(ready(50));
		assert.equal(m.view().command, COMMANDS.toggle);
	});

	it('an error outranks "disabled"; "disabled" outranks loading and ready', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus(ready(10));
		m.setEnabled(false);
		assert.equal(m.view().text, '$(circle-slash) kspec');
		assert.equal(m.view().severity, 'warning');
		m.onServerStatus({ state: 'error', message: 'x', progress: null, lastLatencyMs: null });
		assert.equal(m.view().severity, 'error');
	});

	it('a process that failed to start or stopped is an error with the log on click', () => {
		const m = new StatusModel();
		m.setPhase('failed', 'kspec was not found');
		assert.equal(m.view().command, COMMANDS.showLog);
		assert.match(m.view().tooltip, /could not start: kspec was not found/);
		m.setPhase('starting');
		m.setPhase('running');
		m.onServerStatus(ready(5));
		m.setPhase('stopped', 'the process exited');
		assert.equal(m.view().severity, 'error');
		assert.match(m.view().tooltip, /stopped: the process exited/);
	});

	it('a restart forgets the previous server state and latency', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus(ready(99));
		m.setPhase('starting');
		m.setPhase('running');
		assert.match(m.view().text, /loading~spin/);
		m.onServerStatus(ready(null));
		assert.equal(m.view().text, '$(check) kspec');
	});
});

describe('busy and timed out', () => {
	it('reads activity and the engine log as kspec lsp sends them; ignores unknown activities', () => {
		assert.deepEqual(parseStatus({ state: 'ready', activity: 'busy', logFile: '/run/kspec/m.log', serverPid: 42 }),
			{ state: 'ready', message: '', progress: null, lastLatencyMs: null, activity: 'busy', logFile: '/run/kspec/m.log' });
		assert.equal(parseStatus({ state: 'ready', activity: 'idle' })?.activity, undefined);
		assert.equal(parseStatus({ state: 'ready', activity: 'napping', logFile: '' })?.logFile, undefined);
	});

	it('shows a request with the engine, then its latency', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus(ready(80));
		m.onServerStatus({ ...ready(80), activity: 'busy' });
		assert.equal(m.view().text, '$(sync~spin) kspec');
		assert.match(m.view().tooltip, /decoding/);
		m.onServerStatus(ready(120));
		assert.equal(m.view().text, '$(check) kspec 120 ms');
	});

	it('stays busy while any document decodes, idle only when none does', () => {
		const m = new StatusModel();
		m.setPhase('running');
		const decoding = parseStatus({ state: 'ready', message: 'ready', latencyMs: 90, activity: 'idle', decoding: ['file:///a.py', 'file:///b.py', 3] });
		assert.deepEqual(decoding?.decoding, ['file:///a.py', 'file:///b.py']);
		m.onServerStatus(decoding!);
		assert.equal(m.view().text, '$(sync~spin) kspec');
		assert.match(m.view().tooltip, /decoding for 2 documents/);
		m.onServerStatus(parseStatus({ state: 'ready', message: 'ready', activity: 'idle', decoding: [] })!);
		assert.equal(m.view().text, '$(check) kspec 90 ms');
	});

	it('says when the last final answer had fewer distinct alternatives than k', () => {
		assert.deepEqual(parseStatus({ state: 'ready', alternatives: { count: 2, k: 4 } })?.alternatives, { count: 2, k: 4 });
		assert.equal(parseStatus({ state: 'ready', alternatives: { count: '2', k: 4 } })?.alternatives, undefined);
		assert.equal(alternativesNote({ count: 4, k: 4 }), '');
		assert.match(alternativesNote({ count: 1, k: 4 }), /1 distinct alternative of k = 4/);
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus(parseStatus({ state: 'ready', message: 'ready', alternatives: { count: 3, k: 4 } })!);
		assert.match(m.view().tooltip, /3 distinct alternatives of k = 4/);
	});

	it('says an empty answer came at the deadline, and where to look', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus({ ...ready(80), activity: 'timedOut', logFile: '/run/kspec/m.log' });
		const v = m.view();
		assert.equal(v.text, '$(watch) kspec timed out');
		assert.equal(v.severity, 'warning');
		assert.equal(v.command, COMMANDS.showLog);
		assert.match(v.tooltip, /deadlineMs/);
		assert.equal(m.engineLog, '/run/kspec/m.log');
		m.onServerStatus(ready(90));
		assert.equal(m.view().text, '$(check) kspec 90 ms');
	});

	it('error and off win over busy', () => {
		const m = new StatusModel();
		m.setPhase('running');
		m.onServerStatus({ ...ready(1), activity: 'busy' });
		m.setEnabled(false);
		assert.match(m.view().text, /circle-slash/);
	});
});

describe('percent', () => {
	it('clamps to 0..100', () => {
		assert.equal(percent(-1), 0);
		assert.equal(percent(0.5), 50);
		assert.equal(percent(3), 100);
	});
});
