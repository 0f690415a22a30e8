// The lcm explorer: one module, no dependencies. Every view reads the daemon's JSON API with
// the token kept in this tab (sessionStorage); addresses are stable (`/ui/summaries/sum_12`).

const view = document.getElementById("view");
const TOKEN_KEY = "lcm-token";
const PAGE = 50;

// ---------------------------------------------------------------------------------------------
// Small helpers

/** An element: h("a", {href: "/ui"}, "text", child, ...). */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    // Through the CSSOM: the page's policy refuses inline style attributes.
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const fmt = (n) => (n ?? 0).toLocaleString("en-US");
const plural = (n, word) => `${fmt(n)} ${word}${n === 1 ? "" : "s"}`;
const link = (id, text) => h("a", { href: addressOf(id) }, text ?? id);

/** The explorer's address of an id. */
function addressOf(id) {
  const kind = String(id).split("_")[0];
  const base = { ses: "sessions", sum: "summaries", msg: "messages", file: "files", job: "maps" }[kind];
  return base ? `/ui/${base}/${encodeURIComponent(id)}` : "/ui";
}

/** The direct sources of a described summary: ids (a condensed summary lists its summaries;
 * a leaf gives the range of its messages, which its manifest lists). */
function sourcesOf(d) {
  if (Array.isArray(d.sources)) return d.sources;
  const direct = (d.manifest?.nodes ?? []).filter((n) => n.parent === d.id).map((n) => n.id);
  return direct.length ? direct : [d.sources?.first, d.sources?.last].filter(Boolean);
}

/** An API error, with the server's message. */
class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** Calls the API; a 401 asks for a token and is thrown as an ApiError. */
async function api(path, { method = "GET", body } = {}) {
  const headers = { accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) {
    const message = data?.error?.message ?? data?.message ?? (typeof data === "string" && data) ?? response.statusText;
    if (response.status === 401) askToken(token ? "The token was refused (wrong or expired): enter another." : "This server asks for a bearer token.");
    throw new ApiError(response.status, message);
  }
  return data;
}

function showError(error) {
  const text = error instanceof ApiError ? `${error.message} (HTTP ${error.status})` : String(error.message ?? error);
  return h("p", { class: "error", role: "alert" }, text);
}

function askToken(why) {
  document.getElementById("token-why").textContent = why;
  const dialog = document.getElementById("token-dialog");
  if (!dialog.open) dialog.showModal();
  document.getElementById("token-input").focus();
}

/** Replaces the view with `nodes`, and gives it the keyboard focus. */
function show(title, ...nodes) {
  document.title = `${title} · lcm`;
  view.replaceChildren(h("h1", {}, title), ...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false));
  view.focus({ preventScroll: true });
}

// ---------------------------------------------------------------------------------------------
// Views

async function sessionsView(params) {
  const filter = params.get("filter") ?? "";
  const data = await api("/v1/sessions?context=true");
  const input = h("input", { type: "search", placeholder: "Filter by key or id", value: filter, "aria-label": "Filter sessions", id: "session-filter" });
  const body = h("tbody");
  const draw = () => {
    const word = input.value.toLowerCase();
    const rows = data.sessions.filter((s) => !word || s.key.toLowerCase().includes(word) || s.id.includes(word));
    body.replaceChildren(
      ...rows.map((s) =>
        h("tr", {},
          h("td", {}, link(s.id)),
          h("td", {}, s.key, s.parent ? h("span", { class: "pill" }, `child of ${s.parent}`) : null),
          h("td", { class: "num" }, fmt(s.message_count)),
          h("td", { class: "num" }, fmt(s.token_total)),
          h("td", {}, s.last_message_at ?? "—"),
          h("td", {}, s.context ? (s.context.summaries > 0 ? `${fmt(s.context.summaries)} summaries, raw from #${s.context.raw_from}` : "not compacted") : "—"),
        )),
    );
  };
  input.addEventListener("input", draw);
  draw();
  show(`Sessions (${fmt(data.sessions.length)})`,
    h("div", { class: "toolbar" }, input),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Session"), h("th", {}, "Key"), h("th", { class: "num" }, "Messages"), h("th", { class: "num" }, "Tokens"), h("th", {}, "Last activity"), h("th", {}, "Context"))), body));
}

/** The context bar: summaries by depth (a forgotten one as its pointer), the pinned block,
 * then the raw tail, in proportion to the tokens the context spends on each. */
function contextBar(layout) {
  const shown = (s) => s.shown_tokens ?? s.token_count;
  const block = layout.pinned_block;
  const total = layout.summaries.reduce((n, s) => n + shown(s), 0) + (block?.tokens ?? 0) + layout.raw_tokens;
  const width = (tokens) => `width:${(100 * tokens) / Math.max(1, total)}%`;
  const bar = h("div", { class: "bar", id: "context-bar", role: "list", "aria-label": "The context as it stands" });
  for (const s of layout.summaries) {
    const depth = Math.min(5, s.depth + 1);
    const what = `${s.id}, depth ${s.depth}, ${fmt(s.token_count)} tokens`;
    bar.append(h("a", {
      role: "listitem", class: s.forgotten ? `d${depth} forgotten` : `d${depth}`, href: addressOf(s.id),
      style: width(shown(s)),
      title: `${s.id}: ${s.kind}, depth ${s.depth}, ${fmt(s.token_count)} tokens for ${fmt(s.descendant_messages)} messages` +
        (s.forgotten ? `; forgotten: shown as a pointer of ${fmt(s.shown_tokens)} tokens` : ""),
      "aria-label": s.forgotten ? `${what}, forgotten` : what,
    }));
  }
  if (block) {
    bar.append(h("a", {
      role: "listitem", class: "pinned", href: "#marks", id: "pinned-block",
      style: width(block.tokens),
      title: `pinned block: ${plural(block.messages, "message")}, ${fmt(block.tokens)} tokens`,
      "aria-label": `pinned block, ${plural(block.messages, "message")}`,
    }));
  }
  if (layout.raw_messages > 0) {
    bar.append(h("a", {
      role: "listitem", class: "raw", href: `#timeline`, id: "raw-tail",
      style: width(layout.raw_tokens),
      title: `raw tail: ${fmt(layout.raw_messages)} messages, ${fmt(layout.raw_tokens)} tokens`,
      "aria-label": `raw tail, ${fmt(layout.raw_messages)} messages`,
      onclick: (e) => { e.preventDefault(); loadTimeline(layout.session.id, layout.raw_from); },
    }));
  }
  const depths = [...new Set(layout.summaries.map((s) => Math.min(5, s.depth + 1)))].sort();
  const legend = h("div", { class: "legend" },
    depths.map((d) => h("span", {}, h("i", { class: `d${d}`, style: `background:var(--d${d})` }), `summaries at depth ${d - 1}${d === 5 ? "+" : ""}`)),
    layout.summaries.some((s) => s.forgotten) ? h("span", {}, h("i", { class: "forgotten" }), "forgotten (a pointer)") : null,
    block ? h("span", {}, h("i", { style: "background:var(--pin)" }), "pinned block") : null,
    layout.raw_messages > 0 ? h("span", {}, h("i", { style: "background:var(--raw)" }), "raw tail") : null,
    h("span", {}, `${fmt(total)} tokens`));
  return [bar, legend];
}

/** The agent's marks (lcm_pin, lcm_forget): what each pinned message is, and where it shows. */
function marksList(layout) {
  if (!layout.pinned.length && !layout.forgotten.length) return null;
  const pinned = layout.pinned.map((m) => h("li", {}, h("span", { class: "mark pinned" }, "pinned"), " ", link(m.id),
    ` ${m.role}, ${fmt(m.shown_tokens)} tokens`,
    m.shown_tokens !== m.token_count ? ` (${fmt(m.token_count)} stored; large parts shown as references)` : "",
    m.session !== layout.session.id ? [", from ", link(m.session)] : ` (#${m.seq})`,
    m.in_block ? ": in the pinned block" : ": in the raw tail"));
  const forgotten = layout.forgotten.map((m) => h("li", {}, h("span", { class: "mark forgotten" }, "forgotten"), " ", link(m.id), ": shown as a pointer"));
  return [h("h2", { id: "marks" }, "Pinned and forgotten"), h("ul", { class: "marks" }, pinned, forgotten)];
}

/** One DAG node, expanded on demand: its sources come from lcm_describe (a summary's manifest
 * gives its children's sizes; a child it leaves out is described when expanded). */
function dagNode(node) {
  const label = h("span", {});
  const drawLabel = () => {
    const ratio = node.token_count && node.descendant_tokens ? `${(node.descendant_tokens / node.token_count).toFixed(1)}×` : null;
    label.replaceChildren(h("span", { class: "pill" }, `depth ${node.depth ?? "?"}`),
      ...(node.forgotten ? [" ", h("span", { class: "mark forgotten" }, "forgotten")] : []),
      ` ${node.kind ?? ""}`,
      node.token_count !== undefined ? ` · ${fmt(node.token_count)} tokens` : "",
      node.first_seq !== undefined ? ` · #${node.first_seq}..#${node.last_seq}` : "",
      node.descendant_messages !== undefined ? ` · ${fmt(node.descendant_messages)} messages` : "",
      ratio ? ` · ${ratio}` : "");
  };
  drawLabel();
  const children = h("ul", { hidden: true });
  let loaded = false;
  const toggle = h("button", {
    type: "button", class: "toggle", "aria-expanded": "false", "aria-label": `expand ${node.id}`,
    onclick: async () => {
      const open = toggle.getAttribute("aria-expanded") === "true";
      toggle.setAttribute("aria-expanded", String(!open));
      toggle.textContent = open ? "+" : "−";
      children.hidden = open;
      if (open || loaded) return;
      loaded = true;
      children.append(h("li", { class: "muted" }, "loading…"));
      try {
        const d = await api(`/v1/describe/${node.id}?manifest_limit=300`);
        Object.assign(node, {
          kind: d.kind, depth: d.depth, token_count: d.token_count,
          descendant_tokens: d.covers?.message_tokens, descendant_messages: d.covers?.messages,
          first_seq: d.covers?.first_seq, last_seq: d.covers?.last_seq,
        });
        drawLabel();
        const known = new Map((d.manifest?.nodes ?? []).map((n) => [n.id, n]));
        children.replaceChildren(...sourcesOf(d).map((src) => {
          const n = known.get(src) ?? {};
          return src.startsWith("sum_")
            ? dagNode({ id: src, kind: n.kind, depth: n.depth, token_count: n.tokens, descendant_messages: n.messages })
            : h("li", {}, link(src), n.role ? [" ", h("span", { class: `role ${n.role}` }, n.role)] : null, n.tokens !== undefined ? ` ${fmt(n.tokens)} tokens` : "");
        }));
      } catch (e) {
        children.replaceChildren(h("li", {}, showError(e)));
      }
    },
  }, "+");
  return h("li", { "data-id": node.id }, toggle, link(node.id), " ", label, children);
}

async function loadTimeline(session, from, scroll = true) {
  const box = document.getElementById("timeline");
  if (!box) return;
  box.replaceChildren(h("p", { class: "muted" }, "loading…"));
  try {
    const page = await api(`/v1/sessions/${session}/messages?from=${from}&limit=${PAGE}`);
    const nav = h("div", { class: "toolbar" },
      h("button", { type: "button", disabled: from === 0, onclick: () => loadTimeline(session, Math.max(0, from - PAGE)) }, "← earlier"),
      h("span", { class: "muted" }, `#${from}..#${from + page.messages.length - 1} of ${fmt(page.message_count)}`),
      h("button", { type: "button", disabled: page.next === null, onclick: () => loadTimeline(session, page.next) }, "later →"));
    box.replaceChildren(nav, h("table", {}, h("tbody", {}, page.messages.map((m) =>
      h("tr", { id: `seq-${m.seq}` },
        h("td", { class: "num" }, `#${m.seq}`),
        h("td", {}, h("span", { class: `role ${m.role}` }, m.role)),
        h("td", {}, link(m.id), m.tool_calls.length ? h("span", { class: "pill" }, m.tool_calls.join(", ")) : null,
          m.mark ? [" ", h("span", { class: `mark ${m.mark}` }, m.mark)] : null,
          h("div", { class: "text" }, m.text + (m.truncated ? " …" : ""))),
        h("td", { class: "num" }, fmt(m.token_count)),
        h("td", { class: "muted" }, m.created_at))))));
    if (scroll) box.scrollIntoView({ block: "start" });
  } catch (e) {
    box.replaceChildren(showError(e));
  }
}

async function sessionView(id) {
  const layout = await api(`/v1/sessions/${encodeURIComponent(id)}/layout`);
  const s = layout.session;
  show(`${s.id} · ${s.key}`,
    h("dl", { class: "facts card" },
      h("dt", {}, "Messages"), h("dd", {}, fmt(s.message_count)),
      h("dt", {}, "Tokens stored"), h("dd", {}, fmt(s.token_total)),
      h("dt", {}, "Summaries"), h("dd", {}, `${fmt(layout.summary_count)} (${fmt(layout.summaries.length)} in the context)`),
      h("dt", {}, "Raw tail"), h("dd", {}, `from #${layout.raw_from}: ${fmt(layout.raw_messages)} messages`),
      layout.pinned.length ? [h("dt", {}, "Pinned"), h("dd", {}, plural(layout.pinned.length, "message") +
        (layout.pinned_block ? ` (${fmt(layout.pinned_block.messages)} in the pinned block, ${fmt(layout.pinned_block.tokens)} tokens)` : ""))] : null,
      layout.forgotten.length ? [h("dt", {}, "Forgotten"), h("dd", {}, `${plural(layout.forgotten.length, "item")} shown as pointers`)] : null,
      s.parent ? [h("dt", {}, "Parent"), h("dd", {}, link(s.parent))] : null),
    h("h2", {}, "The context as it stands"),
    ...contextBar(layout),
    marksList(layout),
    h("h2", {}, "Summary DAG"),
    layout.summaries.length
      ? h("div", { class: "tree", id: "dag" }, h("ul", {}, layout.summaries.map(dagNode)))
      : h("p", { class: "muted" }, "Not compacted: every message is in the context verbatim."),
    h("h2", {}, "Timeline"),
    h("div", { id: "timeline" }));
  // Time from the navigation to the bar drawn (what the page-load figure measures).
  document.body.dataset.contextDrawnMs = String(Math.round(performance.now()));
  loadTimeline(s.id, layout.raw_from > PAGE ? layout.raw_from : 0, false);
}

/** A card of facts and the function adding one (skipped when the value is missing). */
function factList() {
  const facts = h("dl", { class: "facts card" });
  const fact = (k, v) => v !== undefined && v !== null && facts.append(h("dt", {}, k), h("dd", {}, v));
  return [facts, fact];
}

/** The raw answer of lcm_describe, folded. */
const rawDescribe = (d) => h("details", {}, h("summary", {}, "Everything lcm_describe says"), h("pre", {}, JSON.stringify(d, null, 2)));

async function describeView(id) {
  const d = await api(`/v1/describe/${encodeURIComponent(id)}?manifest_limit=100`);
  if (d.type === "file") return fileView(d);
  const [facts, fact] = factList();
  fact("Session", d.session ? link(d.session) : undefined);
  fact("Kind", d.kind);
  fact("Depth", d.depth);
  fact("Role", d.role);
  fact("Time", d.from ? `${d.from} .. ${d.to ?? ""}` : d.at ?? d.created_at);
  fact("Position", d.seq !== undefined ? `#${d.seq}` : undefined);
  fact("Tokens", d.token_count !== undefined ? fmt(d.token_count) : undefined);
  fact("Covers", d.covers ? `#${d.covers.first_seq}..#${d.covers.last_seq}: ${fmt(d.covers.messages)} messages, ${fmt(d.covers.message_tokens)} tokens` : undefined);
  fact("Compression", d.compression_ratio ? `${d.compression_ratio}×` : undefined);
  fact("Covered by", d.covered_by ? link(d.covered_by) : d.type === "message" || d.kind === "leaf" || d.kind === "condensed" ? "nothing: in the context itself" : undefined);
  fact("Path", d.path);
  fact("Marks", d.marks?.map((m) => h("span", { class: "marked" }, h("span", { class: `mark ${m.mark}` }, m.mark), " in ", link(m.session), " ")));
  const known = new Map((d.manifest?.nodes ?? []).map((n) => [n.id, n]));
  const sources = d.type === "summary" ? sourcesOf(d).map((id) => ({ id, ...(known.get(id) ?? {}) })) : [];
  const content = d.content ?? d.text ?? d.exploration ?? d.summary;
  show(`${d.id ?? id}${d.kind ? ` · ${d.kind}` : ""}`,
    facts,
    content ? h("div", { class: "card" }, h("pre", { id: "content" }, content)) : null,
    sources.length ? [h("h2", {}, d.sources?.count ? `Sources: ${fmt(d.sources.count)} messages, ${d.sources.first}..${d.sources.last}` : "Sources"), h("ul", { id: "sources" }, sources.map((n) =>
      h("li", {}, link(n.id), n.kind ? ` ${n.kind}${n.role ? ` (${n.role})` : ""}` : "", n.tokens !== undefined ? `, ${fmt(n.tokens)} tokens` : "")))] : null,
    rawDescribe(d));
}

/** A file record (`lcm_describe` on a `file_N`): where it came from, its exploration summary,
 * and the messages that refer to it, each with the summary that covers it if any. */
function fileView(d) {
  const [facts, fact] = factList();
  fact("Session", d.session ? link(d.session) : undefined);
  fact("Path", d.path);
  fact("Kind", [d.kind, d.language].filter(Boolean).join(", ") || undefined);
  fact("Media type", d.mime_type);
  fact("Size", `${fmt(d.bytes)} bytes, ${fmt(d.tokens)} tokens`);
  fact("Content in", d.content_in ? link(d.content_in) : undefined);
  fact("Seen", d.seen_at);
  fact("On disk now", d.on_disk ? [d.on_disk.state, d.on_disk.detail].filter(Boolean).join(": ") : undefined);
  const referrers = d.referenced_by ?? [];
  show(`${d.id} · file`,
    facts,
    d.exploration ? [h("h2", {}, "Exploration summary"), h("div", { class: "card" }, h("pre", { id: "content" }, d.exploration))] : null,
    referrers.length ? [h("h2", {}, `Referenced by (${fmt(d.references ?? referrers.length)})`), h("ul", { id: "referenced-by" }, referrers.map((r) =>
      h("li", {}, link(r.id), r.covered_by ? [", covered by ", link(r.covered_by)] : "")))] : null,
    rawDescribe(d));
}

async function searchView(params) {
  const value = (name, fallback = "") => params.get(name) ?? fallback;
  const pattern = value("q");
  const mode = value("mode", "regex");
  const scope = value("scope", "messages");
  const choice = (name, options, current, label) => h("select", { name, "aria-label": label },
    options.map(([v, text]) => h("option", { value: v, selected: v === current }, text)));
  const field = (name, placeholder, size = 14) => h("input", { type: "text", name, value: value(name), placeholder, "aria-label": placeholder, size });
  const form = h("form", { class: "toolbar", id: "search-form", role: "search" },
    h("input", { type: "search", name: "q", value: pattern, placeholder: "Pattern or words", "aria-label": "Search for", size: 36, required: true }),
    choice("mode", [["regex", "regex"], ["full_text", "full text"], ["semantic", "semantic"], ["hybrid", "hybrid"]], mode, "Mode"),
    choice("scope", [["messages", "messages"], ["summaries", "summaries"], ["both", "both"]], scope, "Search in"),
    field("session", "Session (ses_N or key)", 20),
    field("summary_id", "Under summary (sum_N)"),
    field("since", "Since (YYYY-MM-DD)"),
    field("before", "Before (YYYY-MM-DD)"),
    h("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const data = new URLSearchParams(new FormData(form));
    for (const [k, v] of [...data]) if (!v) data.delete(k);
    navigate(`/ui/search?${data}`);
  });
  const results = h("div", { id: "results" });
  show("Search", form, results);
  if (!pattern) return;
  const args = { pattern, mode, scope, session: value("session") || "all", limit: 50 };
  for (const name of ["summary_id", "since", "before", "cursor"]) if (value(name)) args[name] = value(name);
  try {
    const page = await api("/v1/grep", { method: "POST", body: args });
    const more = page.next_cursor
      ? h("p", {}, h("a", { href: `/ui/search?${new URLSearchParams({ ...Object.fromEntries(params), cursor: page.next_cursor })}` }, "Next page →"))
      : null;
    results.replaceChildren(
      h("p", { class: "muted" }, `${fmt(page.hits)} hits on this page`),
      ...(page.groups ?? []).map((g) => h("div", { class: "card hit-group" },
        h("div", {}, g.region === "raw_tail" ? "In the raw tail of " : ["Under ", link(g.region), ` (${g.kind}, depth ${g.depth}) in `], link(g.session)),
        h("ul", {}, g.hits.map((hit) => h("li", { class: "hit" },
          link(hit.id), " ", h("span", { class: `role ${hit.role ?? ""}` }, hit.role ?? hit.type), hit.seq !== undefined ? ` #${hit.seq} ` : " ",
          hit.found_by ? h("span", { class: "pill" }, hit.found_by.join(" + ")) : null,
          h("div", { class: "text" }, hit.snippet ?? hit.text ?? "")))))),
      more ?? "");
  } catch (e) {
    results.replaceChildren(showError(e));
  }
}

async function mapsView() {
  const data = await api("/v1/maps");
  const jobs = data.jobs ?? data;
  show(`Map jobs (${fmt(jobs.length)})`, jobs.length
    ? h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Job"), h("th", {}, "Status"), h("th", { class: "num" }, "Done"), h("th", { class: "num" }, "Total"), h("th", {}, "Input"))),
      h("tbody", {}, jobs.map((j) => h("tr", {}, h("td", {}, link(j.id)), h("td", {}, j.status), h("td", { class: "num" }, fmt((j.progress?.completed ?? 0) + (j.progress?.failed ?? 0))), h("td", { class: "num" }, fmt(j.progress?.total)), h("td", {}, j.input_path)))))
    : h("p", { class: "muted" }, "No map jobs."));
}

/** Reads a server-sent event stream with the token (EventSource cannot send headers). */
async function* events(path) {
  const headers = { accept: "text/event-stream" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = `Bearer ${token}`;
  const response = await fetch(path, { headers });
  if (!response.ok) throw new ApiError(response.status, await response.text());
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      const name = block.split("\n").find((l) => l.startsWith("event:"))?.slice(6).trim() ?? "message";
      if (data) yield { name, data: JSON.parse(data) };
    }
  }
}

async function mapView(id) {
  const job = await api(`/v1/maps/${encodeURIComponent(id)}`);
  const fill = h("div", { style: "width:0%" });
  const status = h("span", { id: "map-status" }, job.status);
  const counts = h("span", { id: "map-counts" });
  const draw = (p, s) => {
    const done = (p.completed ?? 0) + (p.failed ?? 0);
    fill.style.width = `${(100 * done) / Math.max(1, p.total ?? 0)}%`;
    counts.textContent = `${fmt(done)} of ${fmt(p.total)} (${fmt(p.failed ?? 0)} failed)`;
    if (s) status.textContent = s;
  };
  draw(job.progress ?? {}, job.status);
  show(`${job.id} · map job`,
    h("dl", { class: "facts card" }, h("dt", {}, "Status"), h("dd", {}, status), h("dt", {}, "Progress"), h("dd", {}, counts),
      h("dt", {}, "Input"), h("dd", {}, job.input_path), h("dt", {}, "Output"), h("dd", {}, job.output_path)),
    h("div", { class: "progress", role: "progressbar", "aria-label": "progress" }, fill));
  if (["completed", "failed", "cancelled"].includes(job.status)) return;
  try {
    for await (const event of events(`/v1/maps/${job.id}/events`)) {
      const d = event.data;
      draw({ total: d.total ?? d.progress?.total, completed: d.completed ?? d.progress?.completed, failed: d.failed ?? d.progress?.failed }, d.status);
    }
    const after = await api(`/v1/maps/${job.id}`);
    draw(after.progress ?? {}, after.status);
  } catch (e) {
    view.append(showError(e));
  }
}

async function healthView() {
  const stats = await api("/v1/stats");
  let metrics = "";
  try {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const r = await fetch("/metrics", { headers: token ? { authorization: `Bearer ${token}` } : {} });
    if (r.ok) metrics = await r.text();
  } catch { /* metrics are optional on this page */ }
  const sum = (name) => metrics.split("\n").filter((l) => l.startsWith(name)).reduce((n, l) => n + Number(l.split(" ").pop()), 0);
  const integrity = h("div", { id: "integrity" }, h("button", { type: "button", onclick: async () => {
    integrity.replaceChildren(h("p", { class: "muted" }, "checking…"));
    try {
      const r = await api("/v1/integrity", { method: "POST" });
      const report = r.report ?? r.check ?? r;
      const violations = report.violations ?? [];
      integrity.replaceChildren(h("p", { class: violations.length ? "error" : "" }, violations.length ? `${violations.length} violations` : "No violations."),
        h("details", {}, h("summary", {}, "The report"), h("pre", {}, JSON.stringify(r, null, 2))));
    } catch (e) {
      integrity.replaceChildren(showError(e));
    }
  } }, "Run the integrity check"));
  show("Health",
    h("dl", { class: "facts card" },
      h("dt", {}, "Sessions"), h("dd", {}, fmt(stats.store.sessions)),
      h("dt", {}, "Messages"), h("dd", {}, fmt(stats.store.messages)),
      h("dt", {}, "Tokens"), h("dd", {}, fmt(stats.store.tokens)),
      h("dt", {}, "Index"), h("dd", {}, `${fmt(stats.index_documents)} documents, watermark ${stats.index_watermark} (next message ${stats.next_message})`),
      h("dt", {}, "Actor restarts"), h("dd", {}, metrics ? fmt(sum("lcm_actor_restarts_total")) : "—"),
      h("dt", {}, "Compactions"), h("dd", {}, metrics ? `${fmt(sum("lcm_compactions_finished_total"))} finished, ${fmt(sum("lcm_compactions_failed_total"))} failed, ${fmt(sum("lcm_compactions_running"))} running` : "—")),
    integrity);
}

// ---------------------------------------------------------------------------------------------
// Routing: `/ui/<view>/<id>`; links are followed without a reload.

const ID = /^(ses|sum|msg|file|job)_[0-9]+$/;

async function route() {
  const url = new URL(location.href);
  const [, , what = "", id = ""] = url.pathname.split("/").map(decodeURIComponent);
  for (const a of document.querySelectorAll("nav a")) {
    a.toggleAttribute("aria-current", a.dataset.nav === (what || "sessions"));
    if (a.hasAttribute("aria-current")) a.setAttribute("aria-current", "page");
  }
  try {
    const needsId = { sessions: "ses", summaries: "sum", messages: "msg", files: "file" }[what];
    if (id && ((needsId && !id.startsWith(`${needsId}_`) && what !== "sessions") || (what !== "sessions" && !ID.test(id)))) {
      return show("Not an id", h("p", { class: "error", role: "alert" }, `“${id}” is not a ${needsId ?? "known"}_N id.`), h("p", {}, h("a", { href: "/ui" }, "Back to the sessions")));
    }
    if (!what) return await sessionsView(url.searchParams);
    if (what === "sessions" && id) return await sessionView(id);
    if (what === "sessions") return await sessionsView(url.searchParams);
    if (["summaries", "messages", "files"].includes(what) && id) return await describeView(id);
    if (what === "search") return await searchView(url.searchParams);
    if (what === "maps" && id) return await mapView(id);
    if (what === "maps") return await mapsView();
    if (what === "health") return await healthView();
    show("Not found", h("p", { class: "error", role: "alert" }, `No view at ${url.pathname}.`));
  } catch (e) {
    show("Could not load this view", showError(e));
  }
}

function navigate(address) {
  history.pushState(null, "", address);
  route();
}

document.addEventListener("click", (e) => {
  const a = e.target.closest("a");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin === location.origin && url.pathname.startsWith("/ui")) {
    e.preventDefault();
    navigate(url.pathname + url.search);
  }
});
window.addEventListener("popstate", route);

document.getElementById("token-button").addEventListener("click", () => askToken("The bearer token this page sends (kept in this tab only)."));
document.getElementById("token-form").addEventListener("submit", () => {
  const value = document.getElementById("token-input").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  route();
});
document.getElementById("token-clear").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("token-dialog").close();
  route();
});

route();
