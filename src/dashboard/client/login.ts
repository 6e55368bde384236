/**
 * The login page's only script (served as /assets/login.js; the CSP allows no inline script):
 * carries the `#/route` the operator was on through the form post and the Basic sign-in link,
 * so logging in lands back on it. The server accepts only a `#/...` fragment as `next`.
 */
const hash = location.hash;
if (/^#\//.test(hash)) {
  const next = document.querySelector('input[name="next"]');
  if (next instanceof HTMLInputElement) next.value = hash;
  const basic = document.getElementById('basic-login');
  if (basic) basic.setAttribute('href', `${basic.getAttribute('href')}?next=${encodeURIComponent(hash)}`);
}
