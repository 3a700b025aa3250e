// The gateway's operator console in headless Chromium (driven by playwright-core), against a
// running `palisade gateway` whose [web] listener serves /console.
//
// Usage: INTEROP_NODE_MODULES=DIR CONSOLE_URL=https://127.0.0.1:PORT/console \
//        CONSOLE_OPERATOR=NAME CONSOLE_TOKEN=TOKEN WEB_CERT=PEM WEB_KEY=PEM \
//        EXPECT_UPSTREAM=ID EXPECT_DISABLED=KIND:VALUE EXPECT_LAYOUT=console-layout.json \
//        node console_page.mjs [OUT_DIR]
//   CHROMIUM (default /usr/bin/chromium) is the browser. Screenshots go to OUT_DIR
//   (console-390.png, console-1280.png).
//
// Checks, each printed as `ok - console: …` or `FAIL - console: …` (exit status 1 on any FAIL):
//   1. the sign-in form; a wrong token refused; the right one shows the console, with every
//      section, the upstream EXPECT_UPSTREAM, the target EXPECT_DISABLED shown by name as DISABLE
//      at the kill switch, a definition awaiting a decision linking the review
//      page, the audit tail with its chain status and charts drawn as inline SVG;
//   2. the exact CSP and X-Frame-Options: DENY on the console's response, and no script at all;
//   3. framed by a page of another origin of the same site: the frame shows nothing of it;
//   4. a forged POST: a sign-out posted from another origin, and one from the console's origin
//      with a wrong CSRF token, are both refused (403) and the session stands;
//   5. at 390 px wide: nothing wider than the viewport (scrollWidth measured in the page), tables
//      folded into cards; the bounding boxes of the page's landmarks at 390 and 1280 px match
//      EXPECT_LAYOUT within 6 px (x and width: font-independent), and screenshots are written.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';

const env = process.env;
for (const name of ['INTEROP_NODE_MODULES', 'CONSOLE_URL', 'CONSOLE_OPERATOR', 'CONSOLE_TOKEN', 'WEB_CERT', 'WEB_KEY',
  'EXPECT_UPSTREAM', 'EXPECT_DISABLED', 'EXPECT_LAYOUT']) {
  if (!env[name]) {
    console.error(`console_page.mjs: ${name} is not set`);
    process.exit(2);
  }
}
const outDir = process.argv[2] ?? fs.mkdtempSync(path.join(os.tmpdir(), 'console-'));
const require = createRequire(path.join(path.resolve(env.INTEROP_NODE_MODULES), '..', 'resolve-from-here.js'));
const { chromium } = require('playwright-core');

const CONSOLE = env.CONSOLE_URL;
const ORIGIN = new URL(CONSOLE).origin;
const CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
const TOLERANCE = 6;
let failures = 0;
function report(ok, name, detail = '') {
  if (!ok) failures += 1;
  const line = `${ok ? 'ok' : 'FAIL'} - console: ${name}`;
  console.log(detail ? `${line}: ${detail}` : line);
}
const watchdog = setTimeout(() => {
  report(false, 'the driver did not finish within 120 s');
  process.exit(1);
}, 120_000);

// Another origin of the same site (another port, the same certificate) serving `otherHtml`.
let otherHtml = '';
const other = https.createServer({ cert: fs.readFileSync(env.WEB_CERT), key: fs.readFileSync(env.WEB_KEY) },
  (_req, res) => res.writeHead(200, { 'content-type': 'text/html', 'cache-control': 'no-store' }).end(otherHtml));
await new Promise((resolve) => other.listen(0, '127.0.0.1', resolve));
const OTHER = `https://127.0.0.1:${other.address().port}/`;
const attr = (text) => text.replaceAll('&', '&amp;').replaceAll('"', '&quot;');

async function signIn(page, token) {
  await page.goto(CONSOLE);
  await page.fill('input[name=operator]', env.CONSOLE_OPERATOR);
  await page.fill('input[name=token]', token);
  const [answer] = await Promise.all([
    page.waitForResponse((r) => r.url().endsWith('/console/login')),
    page.click('button[type=submit]'),
  ]);
  await page.waitForLoadState('load');
  return answer.status();
}

// The bounding boxes (x, width) of the landmarks the layout expectations name.
async function boxes(page) {
  const expected = JSON.parse(fs.readFileSync(env.EXPECT_LAYOUT, 'utf8'));
  const names = Object.keys(expected['390']);
  const out = {};
  for (const selector of names) {
    const box = await page.locator(selector).first().boundingBox();
    out[selector] = box ? { x: Math.round(box.x), width: Math.round(box.width) } : null;
  }
  return out;
}

function compare(width, measured) {
  const expected = JSON.parse(fs.readFileSync(env.EXPECT_LAYOUT, 'utf8'))[String(width)];
  const off = [];
  for (const [selector, want] of Object.entries(expected)) {
    const got = measured[selector];
    if (!got || Math.abs(got.x - want.x) > TOLERANCE || Math.abs(got.width - want.width) > TOLERANCE) {
      off.push(`${selector}: want ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
    }
  }
  return off;
}

let browser;
try {
  browser = await chromium.launch({
    executablePath: env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--no-first-run'],
    timeout: 15000,
  });
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(15000);

  // 1. Sign-in and content.
  await page.goto(CONSOLE);
  report(await page.locator('form[action="/console/login"]').count() === 1 && await page.locator('#upstreams').count() === 0,
    'signed out, the console shows only its sign-in form');
  const wrong = await signIn(page, `${env.CONSOLE_TOKEN}-wrong`);
  report(wrong === 403 && await page.locator('#upstreams').count() === 0, 'a wrong token is refused', `status ${wrong}`);
  const right = await signIn(page, env.CONSOLE_TOKEN);
  const operator = await page.locator('#operator').textContent().catch(() => null);
  report(right === 303 && operator === env.CONSOLE_OPERATOR, 'the right token signs in', `status ${right}, operator ${operator}`);
  const sections = ['upstreams', 'definitions', 'killswitch', 'connections', 'delegations', 'audit', 'metrics'];
  const missing = [];
  for (const id of sections) if (await page.locator(`section#${id}`).count() !== 1) missing.push(id);
  report(missing.length === 0, 'every section is shown', missing.join(', '));
  const upstreamText = await page.locator('#upstream-table').textContent();
  report(upstreamText.includes(env.EXPECT_UPSTREAM), `the upstream ${env.EXPECT_UPSTREAM} is listed`, upstreamText.slice(0, 200));
  const switched = await page.locator('#killswitch-table tr', { hasText: env.EXPECT_DISABLED }).textContent().catch(() => '');
  report(switched.includes('DISABLE'), `the kill switch shows ${env.EXPECT_DISABLED} by name, disabled`, switched);
  const reviewLinks = await page.locator('#definitions a[href^="/review#pin-"]').count();
  const findings = await page.locator('#definitions [data-finding]').count();
  report(reviewLinks >= 1 && findings >= 1, 'definitions awaiting a decision link the review page, with their findings',
    `${reviewLinks} links, ${findings} findings`);
  const chain = await page.locator('#chain-status').textContent();
  report(/intact/.test(chain), 'the audit tail shows the chain status', chain);
  const audit = await page.locator('#audit-table').textContent();
  report(audit.includes('console/signed_in'), 'the audit tail holds this sign-in');
  const charts = await page.locator('#metrics figure.chart svg.chart').count();
  const drawn = await page.locator('#chart-requests polyline, #chart-requests circle').count();
  report(charts >= 3 && drawn >= 1, 'the metrics are charted as inline SVG', `${charts} charts, ${drawn} drawn lines`);
  const hostile = await page.locator('#definitions img, #definitions script').count();
  report(hostile === 0, 'nothing an upstream wrote became markup');

  // 2. Headers, and no script.
  const response = await page.goto(CONSOLE);
  const headers = response.headers();
  report(headers['content-security-policy'] === CSP && headers['x-frame-options'] === 'DENY',
    'the console is sent with the strict CSP and X-Frame-Options: DENY',
    `${headers['content-security-policy']}; ${headers['x-frame-options']}`);
  report(await page.locator('script').count() === 0, 'the console runs no script');

  // 3. Framing.
  otherHtml = `<!doctype html><title>framer</title><iframe id="victim" width="800" height="600" src="${attr(CONSOLE)}"></iframe>`;
  const [framedAnswer] = await Promise.all([
    page.waitForResponse((r) => r.url() === CONSOLE && r.frame() !== page.mainFrame()),
    page.goto(OTHER),
  ]);
  await page.waitForTimeout(300);
  const frame = await (await page.locator('#victim').elementHandle())?.contentFrame();
  let framed = '';
  try { framed = frame ? await frame.content() : ''; } catch { framed = ''; }
  report(framedAnswer.headers()['x-frame-options'] === 'DENY' && !framed.includes('id="upstreams"'),
    'framed by another origin, the frame shows nothing of the console', `${framed.length} chars in the frame`);

  // 4. Forged POSTs.
  otherHtml = `<!doctype html><title>poster</title><form id="f" method="post" action="${attr(`${ORIGIN}/console/logout`)}">`
    + '<input type="hidden" name="csrf" value="forged"><button id="go" type="submit">go</button></form>';
  await page.goto(OTHER);
  const [crossAnswer] = await Promise.all([
    page.waitForResponse((r) => r.url() === `${ORIGIN}/console/logout`),
    page.click('#go'),
  ]);
  const sameOrigin = await context.request.post(`${ORIGIN}/console/logout`, {
    form: { csrf: 'forged-token' }, headers: { origin: ORIGIN }, maxRedirects: 0,
  });
  await page.goto(CONSOLE);
  const still = await page.locator('#operator').count();
  report(crossAnswer.status() === 403 && sameOrigin.status() === 403 && still === 1,
    'a forged sign-out (another origin; a wrong CSRF token) is refused and the session stands',
    `cross-origin ${crossAnswer.status()}, wrong token ${sameOrigin.status()}, still signed in: ${still === 1}`);

  // 5. Layout.
  const layout = {};
  for (const width of [390, 1280]) {
    await page.setViewportSize({ width, height: 844 });
    await page.goto(CONSOLE);
    // Every rendered element outside a scrolling box (a <pre> scrolls on its own) ends within the
    // viewport, and the document is no wider than it.
    const overflow = await page.evaluate(() => {
      const scrolls = (e) => {
        for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
          if (getComputedStyle(p).overflowX !== 'visible') return true;
        }
        return false;
      };
      const past = [...document.querySelectorAll('body *')]
        .filter((e) => e.checkVisibility() && !scrolls(e) && e.getBoundingClientRect().right > window.innerWidth + 0.5)
        .map((e) => `${e.tagName.toLowerCase()}${e.id ? `#${e.id}` : ''}${e.className?.baseVal ?? (e.className ? `.${e.className}` : '')}`);
      return { scroll: document.documentElement.scrollWidth, inner: window.innerWidth, past: past.slice(0, 5) };
    });
    if (width === 390) {
      report(overflow.scroll <= overflow.inner && overflow.past.length === 0,
        'at 390 px nothing is wider than the screen', JSON.stringify(overflow));
      const headerShown = await page.locator('#upstream-table thead').isVisible();
      report(!headerShown, 'at 390 px the tables fold into cards');
    }
    layout[width] = await boxes(page);
    await page.screenshot({ path: path.join(outDir, `console-${width}.png`), fullPage: true });
  }
  const off = [...compare(390, layout[390]), ...compare(1280, layout[1280])];
  report(off.length === 0, 'the landmarks are where the committed layout expects them', off.join('; ') || JSON.stringify(layout));
} catch (error) {
  report(false, 'the driver failed', String(error?.stack ?? error).split('\n').slice(0, 4).join(' | '));
} finally {
  clearTimeout(watchdog);
  await browser?.close();
  other.close();
}
console.log(`${failures === 0 ? 'PASS' : 'FAIL'} console (${failures} failures; screenshots in ${outDir})`);
process.exit(failures === 0 ? 0 : 1);
