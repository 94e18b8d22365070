// Which documents the server is still decoding for (`decoding` in `$/kspec/status`, and a final
// `$/kspec/suggestionsUpdated`), and waiting for one to be done: Alt+] / Alt+[ pressed while
// the document decodes join that decoding (cycling then goes over the final alternatives, not
// the early ones). No `vscode` import: extension.ts feeds it and runs the commands.

/** After the status says a document no longer decodes, how long a final notification may follow. */
export const GRACE_MS = 100;

export class DecodingDocuments {
	private decoding = new Set<string>();
	private readonly waiters = new Map<string, Array<() => void>>();

	/** The server's list of the documents whose engine work runs (each status). A document that
	 * left it ends its waits after GRACE_MS: the server tells the status first, then the final
	 * `$/kspec/suggestionsUpdated` (if any), which then finds them still waiting. */
	update(uris: readonly string[]): void {
		this.decoding = new Set(uris);
		for (const uri of [...this.waiters.keys()]) {
			if (!this.decoding.has(uri)) {
				setTimeout(() => this.decoding.has(uri) || this.done(uri), GRACE_MS);
			}
		}
	}

	/** A final `$/kspec/suggestionsUpdated` for `uri`: its alternatives are final now. */
	finished(uri: string): void {
		this.decoding.delete(uri);
		this.done(uri);
	}

	has(uri: string): boolean {
		return this.decoding.has(uri);
	}

	/** Someone waits for `uri` (a join): the notification handler leaves the showing to it. */
	joining(uri: string): boolean {
		return this.waiters.has(uri);
	}

	/** Resolves true once `uri` is no longer decoding (at once when it is not), false after `timeoutMs`. */
	wait(uri: string, timeoutMs: number): Promise<boolean> {
		if (!this.decoding.has(uri)) {
			return Promise.resolve(true);
		}
		return new Promise((resolve) => {
			let settled = false;
			const timer = setTimeout(() => finish(false), Math.max(0, timeoutMs));
			const finish = (value: boolean) => {
				if (settled) {
					return;
				}
				settled = true;
				clearTimeout(timer);
				const left = (this.waiters.get(uri) ?? []).filter((w) => w !== onDone);
				if (left.length > 0) {
					this.waiters.set(uri, left);
				} else {
					this.waiters.delete(uri);
				}
				resolve(value);
			};
			const onDone = () => finish(true);
			this.waiters.set(uri, [...(this.waiters.get(uri) ?? []), onDone]);
		});
	}

	private done(uri: string): void {
		const waiting = this.waiters.get(uri) ?? [];
		for (const w of waiting) {
			w();
		}
	}
}

export interface CycleDeps {
	/** The active editor's document URI (as sent to the server), if any. */
	activeUri(): string | undefined;
	decoding: DecodingDocuments;
	/** How long to wait at most (the request's deadline). */
	timeoutMs(): number;
	/** Runs a VS Code command and waits for it. */
	run(command: string): PromiseLike<unknown>;
}

export const HIDE_INLINE_SUGGEST = 'editor.action.inlineSuggest.hide';
export const TRIGGER_INLINE_SUGGEST = 'editor.action.inlineSuggest.trigger';
export const SHOW_NEXT_INLINE_SUGGEST = 'editor.action.inlineSuggest.showNext';
export const SHOW_PREVIOUS_INLINE_SUGGEST = 'editor.action.inlineSuggest.showPrevious';

/** VS Code answers a trigger at the place and version of what it shows from what it holds; after
 * a hide it asks the provider again and shows the new first alternative. */
export async function showAgain(run: CycleDeps['run']): Promise<void> {
	await run(HIDE_INLINE_SUGGEST);
	await run(TRIGGER_INLINE_SUGGEST);
}

/** Alt+] / Alt+[ (kspec.showNext / kspec.showPrevious, bound while the active document decodes):
 * wait for the decoding to be done, show the final alternatives, then step as VS Code's own
 * command does. Not decoding: VS Code's own step at once. */
export async function cycle(deps: CycleDeps, step: typeof SHOW_NEXT_INLINE_SUGGEST | typeof SHOW_PREVIOUS_INLINE_SUGGEST): Promise<void> {
	const uri = deps.activeUri();
	if (uri !== undefined && deps.decoding.has(uri)) {
		await deps.decoding.wait(uri, deps.timeoutMs());
		await showAgain(deps.run);
	}
	await deps.run(step);
}
