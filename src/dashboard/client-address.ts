import type { IncomingMessage } from 'node:http';
import { isIP } from 'node:net';

/**
 * The key failed authentications are counted under for this request's client: its address, an
 * IPv4-mapped IPv6 address as plain IPv4, and an IPv6 address by its /64 (one host usually holds
 * a whole /64, so counting single addresses would give it 2^64 fresh budgets). With `trustProxy`
 * the last X-Forwarded-For entry: the address the proxy in front of us saw.
 */
export function clientKey(req: IncomingMessage, trustProxy: boolean): string {
  let address = req.socket.remoteAddress ?? '';
  if (trustProxy) {
    const header = req.headers['x-forwarded-for'];
    const last = (Array.isArray(header) ? header.join(',') : (header ?? '')).split(',').pop()?.trim();
    if (last && isIP(last)) address = last;
  }
  return addressKey(address);
}

export function addressKey(address: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return mapped[1]!;
  if (isIP(address) !== 6) return address;
  return `${expandIpv6(address).slice(0, 4).join(':')}::/64`;
}

/** The eight groups of an IPv6 address (a zone index dropped), each without leading zeros. */
function expandIpv6(address: string): string[] {
  const plain = address.split('%')[0]!.toLowerCase();
  const [head = '', tail] = plain.split('::');
  const left = head ? head.split(':') : [];
  const right = tail ? tail.split(':') : [];
  const groups =
    tail === undefined
      ? left
      : [...left, ...Array<string>(Math.max(0, 8 - left.length - right.length)).fill('0'), ...right];
  return groups.map((g) => (g.includes('.') ? g : g.replace(/^0+(?=.)/, '')));
}
