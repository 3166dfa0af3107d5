// Talaria's pages: forms call the JSON API with the session's CSRF token; live regions poll their part.
// No build step, no dependencies. Loaded with `defer` from every page (the Content-Security-Policy allows
// no inline script).
"use strict";

(function () {
  const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

  // --- forms -> JSON API ------------------------------------------------------------------------------------

  function fieldValue(el) {
    const kind = el.dataset.kind || "text";
    if (kind === "bool") return el.checked;
    if (kind === "int") return Number.parseInt(el.value, 10);
    const raw = el.value;
    if (kind === "list") return raw.split(/[\n,]/).map((s) => s.trim()).filter(Boolean);
    if (kind === "lines") return raw.split("\n").map((s) => s.trim()).filter(Boolean);
    if (kind === "profiles") {
      const map = {};
      for (const line of raw.split("\n")) {
        if (!line.trim()) continue;
        const at = line.indexOf(":");
        if (at < 0) throw new Error(`"${line.trim()}": write a source, a colon, then its profiles`);
        const source = line.slice(0, at).trim();
        map[source] = line.slice(at + 1).split(",").map((s) => s.trim()).filter(Boolean);
      }
      return map;
    }
    return raw;
  }

  function bodyOf(form) {
    if (form.dataset.body) return JSON.parse(form.dataset.body);
    const body = {};
    let named = false;
    for (const el of form.elements) {
      if (!el.name || el.disabled) continue;
      named = true;
      if (el.dataset.optional !== undefined && el.value === "") continue;
      if (el.dataset.kind === "merge") {  // one field standing for several: its value is their JSON
        Object.assign(body, JSON.parse(el.value));
        continue;
      }
      if (el.dataset.default !== undefined && el.value.trim() === "") {
        body[el.name] = el.dataset.default;
        continue;
      }
      body[el.name] = fieldValue(el);
    }
    return named ? body : null;
  }

  function fill(template, answer) {
    return template.replace(/\{([\w.]+)\}/g, (_, path) =>
      encodeURIComponent(path.split(".").reduce((v, k) => (v == null ? v : v[k]), answer)));
  }

  function showError(form, text) {
    const alert = form.querySelector(".form-error");
    if (!alert) return;
    alert.textContent = text;
    if (text) alert.focus();
  }

  async function send(method, url, body) {
    const headers = { "X-CSRF-Token": csrf(), Accept: "application/json" };
    const init = { method, headers, credentials: "same-origin", redirect: "error" };
    if (body !== null) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(url, init);
    let answer = null;
    try {
      answer = await response.json();
    } catch (_) {
      answer = null;
    }
    return { response, answer };
  }

  function describe(response, answer) {
    if (answer && typeof answer.error === "string") {
      let text = answer.error;
      const wait = response.headers.get("Retry-After");
      if (response.status === 429 && wait) text += ` (about ${wait} s)`;
      return `${text} [${answer.code}]`;
    }
    return `The hub answered ${response.status}.`;
  }

  // chat.js (the conversation page) sends through the same helpers.
  window.talaria = Object.freeze({ csrf, send, describe, showError });

  const afterSuccess = {
    registered: registered,
  };

  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.dataset.api) return;
    event.preventDefault();
    if (form.dataset.busy) return;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    let body;
    try {
      body = bodyOf(form);
    } catch (problem) {
      showError(form, problem.message);
      return;
    }
    form.dataset.busy = "1";
    const buttons = form.querySelectorAll("button");
    buttons.forEach((b) => (b.disabled = true));
    showError(form, "");
    try {
      const { response, answer } = await send(form.dataset.method || "POST", form.dataset.api, body);
      if (!response.ok) {
        const conflict = answer && form.dataset.conflictCode === answer.code;
        showError(form, conflict ? form.dataset.conflictText : describe(response, answer));
        return;  // the form keeps what was typed
      }
      if (form.dataset.onSuccess) {
        afterSuccess[form.dataset.onSuccess](form, answer);
      } else if (form.dataset.next) {
        window.location.assign(fill(form.dataset.next, answer || {}));
      } else {
        window.location.reload();
      }
    } catch (_) {
      showError(form, "The hub could not be reached. Nothing was changed by this page; try again.");
    } finally {
      delete form.dataset.busy;
      buttons.forEach((b) => (b.disabled = false));
    }
  });

  // --- a checkbox that saves at once (a bot's team permission): data-toggle is the route, data-field the key ------

  document.addEventListener("change", async (event) => {
    const box = event.target;
    if (!(box instanceof HTMLInputElement) || !box.dataset.toggle) return;
    const status = document.getElementById(box.dataset.status);
    const wanted = box.checked;
    box.disabled = true;
    if (status) status.textContent = "Saving…";
    try {
      const { response, answer } = await send("PATCH", box.dataset.toggle, { [box.dataset.field]: wanted });
      if (!response.ok) {
        box.checked = !wanted;
        if (status) status.textContent = describe(response, answer);
        return;
      }
      box.defaultChecked = wanted;
      if (status) status.textContent = "Saved.";
    } catch (_) {
      box.checked = !wanted;
      if (status) status.textContent = "The hub could not be reached. Nothing was changed; try again.";
    } finally {
      box.disabled = false;
    }
  });

  // --- a button that shows a hidden form ("Rename"): data-reveal names the form ------------------------------

  document.addEventListener("click", (event) => {
    const button = event.target instanceof Element ? event.target.closest("button[data-reveal]") : null;
    if (!button) return;
    const target = document.getElementById(button.dataset.reveal);
    if (!target) return;
    target.hidden = !target.hidden;
    button.setAttribute("aria-expanded", String(!target.hidden));
    if (!target.hidden) {
      const field = target.querySelector("input, textarea, select");
      if (field) field.focus();
    }
  });

  // --- node registration: runner.json is built here from the answer's config, once ---------------------------

  function registered(form, answer) {
    const panel = document.getElementById("registered");
    let config = answer.config;
    panel.querySelector('[data-field="name"]').textContent = answer.runner.name;
    const download = document.getElementById("download-runner-json");
    download.onclick = () => {
      if (!config) return;
      const blob = new Blob([JSON.stringify(config, null, 2) + "\n"], { type: "application/json" });
      const link = document.createElement("a");
      link.href = URL.createObjectURL(blob);
      link.download = "runner.json";
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10000);
    };
    document.getElementById("register-another").onclick = () => {
      config = null;
      panel.hidden = true;
      document.getElementById("register-card").hidden = false;
      form.reset();
      form.querySelector("input").focus();
    };
    form.reset();
    document.getElementById("register-card").hidden = true;
    panel.hidden = false;
    panel.querySelector("h2").focus();
    refreshAll();
  }

  // --- "Check Hermes on <node>": the node's Hermes version and team-tool readiness, asked through its runner ------

  document.addEventListener("click", async (event) => {
    const button = event.target instanceof Element ? event.target.closest("button[data-check]") : null;
    if (!button) return;
    const out = document.getElementById("hermes-check");
    const name = button.dataset.nodeName;
    out.hidden = false;
    out.textContent = `Asking Hermes on ${name}…`;
    try {
      const response = await fetch(button.dataset.check, { credentials: "same-origin", headers: { Accept: "application/json" } });
      const answer = await response.json();
      if (!response.ok) {
        out.textContent = `${name}: ${describe(response, answer)}`;
        return;
      }
      const tools = answer.teamTools;
      const readiness = tools.checked === false
        ? `team tools not checked: ${tools.reason}`
        : tools.ready
        ? `team tools ready in profile ${tools.profile} (plugin ${tools.pluginVersion})`
        : `team tools not ready in profile ${tools.profile}: missing ${tools.missing.join(", ") || "the plugin"}`;
      out.textContent = `${name}: Hermes ${answer.hermes.version || "of unknown version"}; ${readiness}.`;
    } catch (_) {
      out.textContent = `${name}: the hub could not be reached.`;
    }
  });

  // --- live regions ------------------------------------------------------------------------------------------

  const EVERY_MS = 2000;
  let ended = false;

  function busy(region) {
    // A person typing in, or having changed, a field of the region: do not replace it under them.
    for (const el of region.querySelectorAll("input, textarea, select")) {
      if (el === document.activeElement) return true;
      if ((el.type === "checkbox" && el.checked !== el.defaultChecked) || el.value !== el.defaultValue) return true;
    }
    return region.querySelector("form[data-busy]") !== null;
  }

  async function refresh(region) {
    if (ended || busy(region)) return;
    let response;
    try {
      response = await fetch(region.dataset.live, { credentials: "same-origin", headers: { Accept: "text/html" } });
    } catch (_) {
      return; // the hub is away for a moment: keep what is shown, try again next time
    }
    if (response.status === 401) {
      ended = true;
      document.querySelector(".session-ended").hidden = false;
      return;
    }
    if (!response.ok) return;
    const html = await response.text();
    if (html === region.dataset.shown || busy(region)) return;
    const focused = document.activeElement && region.contains(document.activeElement) ? document.activeElement.id : "";
    region.innerHTML = html;
    region.dataset.shown = html;
    if (region.querySelector("[data-final]")) delete region.dataset.live; // finished: nothing more will change
    if (focused) {
      const again = document.getElementById(focused);
      if (again) again.focus();
    }
  }

  function refreshAll() {
    document.querySelectorAll("[data-live]").forEach((region) => {
      if (region.dataset.live) refresh(region);
    });
  }

  if (document.querySelector("[data-live]")) setInterval(refreshAll, EVERY_MS);
})();
