/**
 * Text from the database is untrusted on a terminal: a task type, queue name, payload, error,
 * dedupe key, worker id or role name may hold escape sequences (ANSI colours, OSC window titles
 * and hyperlinks, cursor moves, a carriage return that overwrites the line before it) written
 * by anyone who can enqueue. Every human-readable line the CLI prints goes through `say` / `warn`,
 * which escape them, so none reaches the terminal raw.
 *
 * Escaped: C0 controls (U+0000-U+001F: NUL, BEL, BS, ESC, CR, ...), DEL (U+007F), C1 controls
 * (U+0080-U+009F, e.g. U+009B, the one-character CSI), the line and paragraph separators
 * (U+2028/9), the bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069) and the
 * direction marks (U+200E, U+200F, U+061C), which reorder what a reader sees. Each becomes a visible `\n`, `\r`, `\t`, `\xHH` or `\uHHHH`.
 * Other text, non-ASCII letters included, is printed as it is. Backslashes are not doubled, so
 * an escaped control and the same characters typed literally look alike: the output is for
 * reading, and `--json` is the exact form.
 */
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is what this regex is for
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/gu;
const CONTROL_BUT_NEWLINE =
  // biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is what this regex is for
  /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/gu;
/**
 * What JSON.stringify leaves raw: it escapes C0 only. These can only occur inside JSON strings,
 * so replacing them with `\uHHHH` keeps the document valid and its values identical.
 */
const JSON_RAW = /[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/gu;

const NAMED: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

function escapeOne(ch: string): string {
  const named = NAMED[ch];
  if (named) return named;
  const code = ch.codePointAt(0)!;
  return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
}

/** One line of database text, made safe: every control character escaped, newlines too. */
export function escapeControl(text: string): string {
  return text.replace(CONTROL, escapeOne);
}

/** Multi-line text (an error with its stack, a pretty-printed payload): newlines kept. */
export function escapeControlKeepLines(text: string): string {
  return text.replace(CONTROL_BUT_NEWLINE, escapeOne);
}

/** JSON text with nothing a terminal would act on; still valid JSON with the same values. */
export function jsonSafe(json: string): string {
  return json.replace(JSON_RAW, (ch) => `\\u${ch.codePointAt(0)!.toString(16).padStart(4, '0')}`);
}

/** Print a line (or lines) on stdout with every control character but newline escaped. */
export function say(text: string): void {
  console.log(escapeControlKeepLines(text));
}

/** The same on stderr. */
export function warn(text: string): void {
  console.error(escapeControlKeepLines(text));
}

/**
 * A stream for the worker's and the dashboard's JSON log lines (the commands'): pino escapes C0
 * in strings but not C1, U+2028/9 or the bidirectional controls and marks, so those are escaped
 * here (the lines stay valid JSON).
 */
export function terminalSafeStream(out: NodeJS.WritableStream): { write(line: string): void } {
  return { write: (line: string) => void out.write(jsonSafe(line)) };
}
