import { BerthInputError } from '../errors.js';

/**
 * libpq's multi-host connection strings, read into one single-host string per host.
 *
 * node-postgres connects to one host; libpq accepts a list (`postgres://h1:5432,h2:5433/db`, or
 * `?host=h1,h2&port=5432,5433`) and `target_session_attrs`, and on connect tries the hosts in
 * order until one answers with the wanted kind of session. berth does the same in its connection
 * layer (src/db/host-selector.ts), so a fleet given every node of an HA formation follows a
 * promotion without a proxy. This module only parses; it never connects.
 */

/** libpq 14's `target_session_attrs` values. */
export const SESSION_ATTRS = ['any', 'read-write', 'read-only', 'primary', 'standby', 'prefer-standby'] as const;
export type SessionAttrs = (typeof SESSION_ATTRS)[number];

export interface ParsedHosts {
  /**
   * At least one; in the order libpq tries them: the original string with only that host (and
   * without target_session_attrs, which pg does not know), a string pg can read.
   */
  readonly hosts: readonly string[];
  readonly sessionAttrs: SessionAttrs;
}

const URL_HEAD = /^(postgres(?:ql)?:\/\/)([^@/?#]*@)?([^/?#]*)(.*)$/s;

/**
 * Split `connectionString` into its hosts. A single-host string comes back unchanged (one entry),
 * so everything pg accepted before is read as before. `field` names the option in messages; a
 * message never echoes the string (it may hold a password).
 */
export function parseHosts(connectionString: string, field: string): ParsedHosts {
  const bad = (why: string) =>
    new BerthInputError(
      `${field} is not a valid PostgreSQL connection string (${why}); expected postgres://user:password@host:port/database or postgres://user:password@host1:port1,host2:port2/database`,
    );
  const head = URL_HEAD.exec(connectionString);
  if (!head) return { hosts: [connectionString], sessionAttrs: 'any' };
  const [, scheme = '', userinfo = '', authority = '', rest = ''] = head;
  const queryAt = rest.indexOf('?');
  const path = queryAt === -1 ? rest : rest.slice(0, queryAt);
  const params = new URLSearchParams(queryAt === -1 ? '' : rest.slice(queryAt + 1));

  const attrs = params.get('target_session_attrs') ?? 'any';
  if (!(SESSION_ATTRS as readonly string[]).includes(attrs))
    throw bad(`target_session_attrs must be one of ${SESSION_ATTRS.join(', ')}, got "${attrs}"`);
  const sessionAttrs = attrs as SessionAttrs;
  params.delete('target_session_attrs');

  const queryHosts = params.get('host');
  const queryPorts = params.get('port');
  const inQuery = (queryHosts?.includes(',') ?? false) || (queryPorts?.includes(',') ?? false);
  if (!authority.includes(',') && !inQuery) {
    if (attrs === 'any' && !connectionString.includes('target_session_attrs'))
      return { hosts: [connectionString], sessionAttrs };
    // One host: the string as the user wrote it, less the parameter pg does not know.
    const only = params.toString();
    return { hosts: [`${scheme}${userinfo}${authority}${path}${only ? `?${only}` : ''}`], sessionAttrs };
  }
  if (authority.includes(',') && queryHosts !== null)
    throw bad('hosts are listed both before the path and in the host parameter');

  let entries: { host: string; port: string | null }[];
  if (authority.includes(',')) {
    entries = authority.split(',').map((item) => splitHostPort(item, bad));
  } else {
    const hostList = (queryHosts ?? '').split(',');
    const portList = queryPorts === null ? [] : queryPorts.split(',');
    const fromAuthority = authority === '' ? null : splitHostPort(authority, bad);
    if (queryHosts === null) {
      // `?port=1,2` with one host before the path: libpq's one host per port.
      entries = portList.map(() => ({ host: fromAuthority?.host ?? '', port: null }));
    } else entries = hostList.map((host) => ({ host, port: null }));
    if (portList.length > 1 && portList.length !== entries.length)
      throw bad(`${entries.length} hosts but ${portList.length} ports`);
    entries = entries.map((e, i) => ({
      ...e,
      port: portList.length === 1 ? (portList[0] ?? null) : (portList[i] ?? null),
    }));
    params.delete('host');
    params.delete('port');
  }
  const query = params.toString();
  const hosts = entries.map(({ host, port }) => {
    if (host === '') throw bad('a host of the list is empty');
    if (port !== null && !/^\d{1,5}$/.test(port)) throw bad(`port "${port}" is not a number`);
    const socket = host.startsWith('/');
    const hostPart = socket ? '' : host.includes(':') ? `[${host}]` : host;
    const extra = new URLSearchParams(query);
    if (socket) extra.set('host', host);
    if (port !== null && socket) extra.set('port', port);
    const q = extra.toString();
    const portPart = port !== null && !socket ? `:${port}` : '';
    return `${scheme}${userinfo}${hostPart}${portPart}${path}${q ? `?${q}` : ''}`;
  });
  return { hosts, sessionAttrs };
}

/** `host`, `host:port`, `[v6]` or `[v6]:port`. */
function splitHostPort(item: string, bad: (why: string) => Error): { host: string; port: string | null } {
  const v6 = /^\[([^\]]+)\](?::(.*))?$/.exec(item);
  if (v6) return { host: v6[1] ?? '', port: v6[2] ?? null };
  const colon = item.lastIndexOf(':');
  if (colon === -1) return { host: item, port: null };
  const port = item.slice(colon + 1);
  if (item.indexOf(':') !== colon) throw bad('an IPv6 address must be in brackets in a host list');
  return { host: item.slice(0, colon), port: port === '' ? null : port };
}
