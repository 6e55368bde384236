/** Numbers, durations and times as the pages show them. */

export function num(n: number | null | undefined): string {
  return Number(n || 0).toLocaleString('en-US');
}

/** A duration: "42s", "3m 5s", "2h 10m", "4d 3h". */
export function age(seconds: number): string {
  const sec = Math.max(0, Math.round(Number(seconds) || 0));
  if (sec < 60) return `${sec}s`;
  if (sec < 3600) return `${Math.floor(sec / 60)}m ${sec % 60}s`;
  if (sec < 86400) return `${Math.floor(sec / 3600)}h ${Math.floor((sec % 3600) / 60)}m`;
  return `${Math.floor(sec / 86400)}d ${Math.floor((sec % 86400) / 3600)}h`;
}

function pad(n: number): string {
  return (n < 10 ? '0' : '') + n;
}

/** The browser's offset from UTC at `d`, as a zone label: "UTC", "UTC+02:00", "UTC-05:30". */
export function zone(d: Date): string {
  const offset = -d.getTimezoneOffset();
  if (offset === 0) return 'UTC';
  const abs = Math.abs(offset);
  return `UTC${offset > 0 ? '+' : '-'}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`;
}

/**
 * A timestamp in the browser's time zone, always with its date and zone: "2026-12-01 07:25:18
 * UTC+01:00". Never the clock alone: a page left open overnight, or read by someone in another
 * zone, would show a time without the day it belongs to.
 */
export function time(iso: string | null | undefined): string {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const clock = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock} ${zone(d)}`;
}

/** How long ago, or how far ahead ("in 5m 0s"); '' for no time or one that is not a time. */
export function ago(iso: string | null | undefined): string {
  if (!iso) return '';
  const ms = Date.now() - new Date(iso).getTime();
  if (!Number.isFinite(ms)) return '';
  return ms >= 0 ? `${age(ms / 1000)} ago` : `in ${age(-ms / 1000)}`;
}

/** A duration in milliseconds: "850 ms", "3.2 s", then as `age`. */
export function duration(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return age(ms / 1000);
}

/** JSON text of a value; String() of one JSON cannot write (a cycle, a bigint). */
export function json(v: unknown, indent?: number): string {
  try {
    return JSON.stringify(v, null, indent);
  } catch {
    return String(v);
  }
}

/** The first `n` characters, with an ellipsis when there were more. */
export function clip(text: string | null | undefined, n: number): string {
  if (!text) return '';
  return text.length > n ? `${text.slice(0, n)}…` : text;
}

/** A queue's limits in a few words: "max 5 running, 20/1s" (the rate as the CLI writes it). */
export function limitText(l: { maxRunning: number | null; rate: string | null }): string {
  return [l.maxRunning === null ? null : `max ${num(l.maxRunning)} running`, l.rate].filter(Boolean).join(', ');
}
