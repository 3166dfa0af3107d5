// A conversation's page (chat.md 6, ADR 0034): the composer, one EventSource following the server-rendered
// snapshot, drafts streaming in as plain text, stored messages swapped in as the server renders them, approval
// cards. Loaded after app.js (whose helpers are window.talaria) on /chats/{id} only; no inline script, no eval.
"use strict";

(function () {
  const root = document.getElementById("chat");
  if (!root || !window.talaria) return;
  const { send, describe, showError } = window.talaria;
  const conversation = root.dataset.conversation;
  const botName = root.dataset.botName;
  const region = document.getElementById("transcript");
  const statusLine = document.getElementById("turn-status");
  const streamAlert = document.getElementById("stream-alert");
  const composer = document.getElementById("composer");
  const input = document.getElementById("message");
  const sendButton = document.getElementById("send");
  const stopButton = document.getElementById("stop");
  const WORKING = "Working…";
  const TERMINAL = ["turn.completed", "turn.failed", "turn.interrupted", "turn.uncertain"];

  let lastApplied = 0; // the newest event id shown: the snapshot's, then each applied event's
  let liveTurn = null; // the id of the turn in progress, if any
  let source = null;
  let sending = false;
  let stopped = false; // the stream is closed for good
  const ended = new Set(); // turns seen ending (a late 202 must not make one live again)
  const fetches = new Map(); // message id -> the number of the latest fetch of its article
  const pending = []; // uploaded attachments not sent yet: {id, name, item}

  const messages = () => document.getElementById("messages");
  const articleOf = (id) => document.getElementById(`msg-${id}`);
  const capital = (text) => (text ? text[0].toUpperCase() + text.slice(1) : text);

  function statusOf(turn) {
    const { state, code } = turn;
    if (state === "queued" || state === "pending") return turn.waitingReason ? capital(turn.waitingReason) : WORKING;
    if (state === "running" || state === "recovering") return WORKING;
    if (state === "completed") return "";
    if (state === "interrupted" && code === "stopped") return "Stopped";
    if (state === "uncertain") return `Outcome unknown: ${code}`;
    return `Not finished: ${code}`;
  }

  function setStatus(text) {
    if (statusLine.textContent !== text) statusLine.textContent = text;
  }

  function setLive(turnId) {
    liveTurn = turnId && !ended.has(turnId) ? turnId : null;
    if (sendButton) sendButton.disabled = liveTurn !== null || sending;
    if (stopButton) {
      stopButton.hidden = liveTurn === null;
      stopButton.disabled = false;
    }
  }

  // Keep the newest message in view while the reader is at the bottom of the page.
  function keepingBottom(change) {
    const doc = document.documentElement;
    const atBottom = window.innerHeight + window.scrollY >= doc.scrollHeight - 96;
    change();
    if (atBottom) window.scrollTo(0, doc.scrollHeight);
  }

  // --- the snapshot ----------------------------------------------------------------------------------------

  function readSnapshot() {
    const snap = region.querySelector(".chat-snapshot");
    lastApplied = Number(snap.dataset.lastEventId) || 0;
    setLive(snap.dataset.liveTurn || null);
    setStatus(snap.dataset.status || "");
    let approvals = [];
    try {
      approvals = JSON.parse(snap.dataset.approvals || "[]");
    } catch (_) {
      approvals = [];
    }
    approvals.forEach((approval) => showApproval(approval, approval.turnId));
  }

  async function reloadTranscript() {
    let response;
    try {
      response = await fetch(root.dataset.transcript, { credentials: "same-origin", headers: { Accept: "text/html" } });
    } catch (_) {
      return false;
    }
    if (response.status === 401) {
      sessionEnded();
      return false;
    }
    if (!response.ok) return false;
    const html = await response.text();
    keepingBottom(() => {
      region.innerHTML = html;
    });
    readSnapshot();
    return true;
  }

  // --- messages --------------------------------------------------------------------------------------------

  function nameOf(message) {
    if (message.role === "user") return "You";
    if (message.role === "tool") return `${botName} used ${(message.tool && message.tool.name) || "a tool"}`;
    if (message.role === "system") return "Talaria";
    return botName;
  }

  function fromTemplate(id, messageId) {
    const article = document.getElementById(id).content.firstElementChild.cloneNode(true);
    article.id = `msg-${messageId}`;
    article.dataset.messageId = messageId;
    const who = article.querySelector(".author");
    who.id = `by-${messageId}`;
    article.setAttribute("aria-labelledby", who.id);
    return article;
  }

  // A message that is not stored yet goes after the stored ones, a stored one before the live draft.
  function place(article, stored) {
    const log = messages();
    const draft = stored ? log.querySelector("article[data-draft]") : null;
    keepingBottom(() => {
      if (draft) log.insertBefore(article, draft);
      else log.appendChild(article);
      const empty = region.querySelector(".empty-log");
      if (empty) empty.remove();
    });
  }

  // Show a stored message (render it once per id; ``refresh``: it changed, as a tool message does when done).
  function showMessage(message, refresh) {
    let article = articleOf(message.id);
    if (article && !refresh && !article.hasAttribute("data-draft") && !article.hasAttribute("data-placeholder")) {
      return;
    }
    if (!article) {
      article = fromTemplate("placeholder-template", message.id);
      article.classList.add(`msg-${message.role}`);
      article.querySelector(".author").textContent = nameOf(message);
      article.querySelector(".body").textContent = message.content;
      place(article, true);
    }
    article.removeAttribute("data-draft"); // stored now: no longer the draft a turn's end removes
    article.dataset.placeholder = "";
    loadArticle(message.id);
  }

  async function loadArticle(id) {
    const ticket = (fetches.get(id) || 0) + 1;
    fetches.set(id, ticket);
    let response;
    try {
      response = await fetch(`/chats/${conversation}/messages/${id}`, {
        credentials: "same-origin",
        headers: { Accept: "text/html" },
      });
    } catch (_) {
      return; // the placeholder keeps the text; a reload shows the stored article
    }
    if (response.status === 401) {
      sessionEnded();
      return;
    }
    if (!response.ok) return;
    const html = await response.text();
    const current = articleOf(id);
    if (fetches.get(id) !== ticket || !current) return;
    const holder = document.createElement("template");
    holder.innerHTML = html.trim();
    const fresh = holder.content.firstElementChild;
    if (fresh) keepingBottom(() => current.replaceWith(fresh));
  }

  function appendDelta(data) {
    let article = articleOf(data.messageId);
    if (!article) {
      article = fromTemplate("draft-template", data.messageId);
      article.dataset.turnId = data.turnId;
      place(article, false);
    }
    if (!article.hasAttribute("data-draft")) return;
    if (liveTurn) setStatus(WORKING); // a turn that waited for its node says nothing when it starts running
    keepingBottom(() => article.querySelector(".body").append(data.text));
  }

  function turnEnded(turn) {
    ended.add(turn.id);
    if (liveTurn === turn.id) setLive(null);
    setStatus(statusOf(turn));
    // streamed text that was never stored (an uncertain end): the page shows what a reload would
    messages().querySelectorAll(`article[data-draft][data-turn-id="${turn.id}"]`).forEach((a) => a.remove());
    document.querySelectorAll(`.approval[data-turn-id="${turn.id}"][data-state="pending"]`).forEach((card) =>
      resolveCard(card, { state: "expired" }));
  }

  function conversationUpdated(updated) {
    document.getElementById("chat-title").textContent = updated.title;
    document.title = `${updated.title} · Talaria`;
    if (String(updated.archived ? 1 : 0) !== root.dataset.archived) window.location.reload();
  }

  const handlers = {
    "turn.started": (data) => {
      setLive(data.turn.id);
      setStatus(statusOf(data.turn));
      if (data.message) showMessage(data.message, false);
    },
    "turn.waiting": (data) => setStatus(capital(data.waitingReason)),
    "turn.recovering": () => setStatus(WORKING),
    "message.delta": appendDelta,
    "message.complete": (data) => showMessage(data.message, false),
    "tool.started": (data) => {
      showMessage(data.message, true);
      setStatus(WORKING);
    },
    "tool.completed": (data) => showMessage(data.message, true),
    "approval.requested": (data) => showApproval(data.approval, data.turnId),
    "approval.resolved": (data) => {
      const card = document.getElementById(`apr-${data.approval.id}`);
      if (card) resolveCard(card, data.approval);
    },
    "conversation.updated": (data) => conversationUpdated(data.conversation),
  };
  TERMINAL.forEach((kind) => (handlers[kind] = (data) => turnEnded(data.turn)));

  // --- the live stream -------------------------------------------------------------------------------------

  function onEvent(event) {
    const id = Number(event.lastEventId);
    if (!(id > lastApplied)) return; // shown already (in the snapshot, or before a reconnect)
    lastApplied = id;
    let data;
    try {
      data = JSON.parse(event.data);
    } catch (_) {
      return;
    }
    handlers[event.type](data);
  }

  async function onReset() {
    if (source) source.close();
    source = null;
    if (await reloadTranscript()) openStream();
    else closedForGood();
  }

  function openStream() {
    source = new EventSource(`${root.dataset.events}?after=${lastApplied}`);
    Object.keys(handlers).forEach((kind) => source.addEventListener(kind, onEvent));
    source.addEventListener("stream.reset", onReset);
    source.onerror = () => {
      // a dropped connection reconnects by itself (with Last-Event-ID); CLOSED means the hub refused it
      if (source && source.readyState === EventSource.CLOSED) closedForGood();
    };
  }

  function sessionEnded() {
    stopped = true;
    if (source) source.close();
    const notice = document.querySelector(".session-ended");
    if (notice) notice.hidden = false;
  }

  async function closedForGood() {
    if (stopped) return;
    stopped = true;
    if (source) source.close();
    source = null;
    try {
      const probe = await fetch(root.dataset.transcript, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (probe.status === 401) {
        sessionEnded();
        return;
      }
    } catch (_) {
      // the hub is away: say the live updates stopped
    }
    streamAlert.textContent = "Live updates stopped. Reload the page.";
  }

  // --- approvals -------------------------------------------------------------------------------------------

  const RESOLVED = { approved: "Approved", denied: "Denied", answered: "Answered", expired: "Expired" };

  function resolveCard(card, approval) {
    const actions = card.querySelector(".approval-actions");
    if (!actions) return; // resolved already: an answer's reply and its approval.resolved event both resolve it
    let text = RESOLVED[approval.state];
    if (!text) text = approval.choice === "deny" ? "Denied" : card.dataset.kind === "clarify" ? "Answered" : "Approved";
    card.dataset.state = approval.state || "resolved";
    const done = document.createElement("p");
    done.className = "approval-result";
    done.textContent = text;
    actions.replaceWith(done);
  }

  function answerButton(label, onClick) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.addEventListener("click", onClick);
    return button;
  }

  async function answer(card, turnId, body) {
    const alert = card.querySelector(".form-error");
    card.querySelectorAll("button").forEach((b) => (b.disabled = true));
    alert.textContent = "";
    try {
      const url = `/api/conversations/${conversation}/turns/${turnId}/approvals`;
      const { response, answer: answered } = await send("POST", url, body);
      if (response.ok) {
        resolveCard(card, answered.approval);
        return;
      }
      alert.textContent = describe(response, answered);
    } catch (_) {
      alert.textContent = "The hub could not be reached; try again.";
    }
    card.querySelectorAll("button").forEach((b) => (b.disabled = false));
  }

  function showApproval(approval, turnId) {
    if (document.getElementById(`apr-${approval.id}`)) return;
    const clarify = approval.kind === "clarify";
    const card = document.createElement("div");
    card.className = "approval";
    card.id = `apr-${approval.id}`;
    card.dataset.kind = approval.kind;
    card.dataset.turnId = turnId;
    card.dataset.state = approval.state || "pending";
    card.setAttribute("role", "group");
    card.setAttribute("aria-label", clarify ? `Question from ${botName}` : "Approval needed");
    const heading = document.createElement("p");
    heading.className = "approval-title";
    heading.textContent = clarify ? `Question from ${botName}` : "Approval needed";
    const text = document.createElement("p");
    text.textContent = clarify ? approval.question || "" : approval.description || "";
    card.append(heading, text);
    if (!clarify && approval.command) {
      const command = document.createElement("pre");
      command.textContent = approval.command;
      card.append(command);
    }
    const actions = document.createElement("div");
    actions.className = "approval-actions";
    if (clarify) {
      (approval.choices || []).forEach((choice) =>
        actions.append(answerButton(choice, () => answer(card, turnId, { approvalId: approval.id, answer: choice }))));
      const label = document.createElement("label");
      const field = document.createElement("input");
      field.id = `answer-${approval.id}`;
      field.maxLength = 4000;
      label.htmlFor = field.id;
      label.textContent = "Your answer";
      actions.append(label, field, answerButton("Reply", () => {
        if (field.value.trim()) answer(card, turnId, { approvalId: approval.id, answer: field.value });
      }));
    } else {
      actions.append(
        answerButton("Approve", () => answer(card, turnId, { approvalId: approval.id, choice: "once" })),
        answerButton("Deny", () => answer(card, turnId, { approvalId: approval.id, choice: "deny" })));
    }
    const alert = document.createElement("p");
    alert.className = "form-error";
    alert.setAttribute("role", "alert");
    card.append(actions, alert);
    keepingBottom(() => region.querySelector("#approvals").append(card));
    if (card.dataset.state !== "pending") resolveCard(card, approval);
  }

  // --- the composer ----------------------------------------------------------------------------------------

  async function submit(event) {
    event.preventDefault();
    if (sending || liveTurn) return;
    const text = input.value;
    if (!text.trim()) {
      showError(composer, "Write a message first.");
      return;
    }
    sending = true;
    setLive(liveTurn);
    showError(composer, "");
    const body = { text };
    if (pending.length) body.attachments = pending.map((a) => a.id);
    try {
      const { response, answer: accepted } = await send("POST", composer.dataset.turns, body);
      if (response.status === 202) {
        input.value = "";
        pending.splice(0).forEach((a) => a.item.remove());
        sending = false;
        // the stream may have told more already (turn.waiting, even its end): the answer is older news then
        const told = liveTurn === accepted.turn.id || ended.has(accepted.turn.id);
        setLive(accepted.turn.id);
        if (!told) setStatus(statusOf(accepted.turn));
        showMessage(accepted.message, false);
        input.focus();
        return;
      }
      showError(composer, describe(response, accepted));
    } catch (_) {
      showError(composer, "The hub could not be reached. The message was not sent; try again.");
    } finally {
      sending = false;
      setLive(liveTurn);
    }
    input.focus();
  }

  async function stopTurn() {
    if (!liveTurn) return;
    stopButton.disabled = true;
    try {
      const { response, answer: stoppedTurn } = await send("POST", `${composer.dataset.turns}/${liveTurn}/stop`, null);
      if (!response.ok) showError(composer, describe(response, stoppedTurn));
    } catch (_) {
      showError(composer, "The hub could not be reached; try again.");
      stopButton.disabled = false;
    }
  }

  async function upload(file) {
    const url = `${composer.dataset.uploads}?name=${encodeURIComponent(file.name)}`;
    const headers = { "X-CSRF-Token": window.talaria.csrf(), Accept: "application/json",
                      "Content-Type": file.type || "application/octet-stream" };
    let response;
    let answered = null;
    try {
      response = await fetch(url, { method: "POST", headers, body: file, credentials: "same-origin", redirect: "error" });
      answered = await response.json().catch(() => null);
    } catch (_) {
      showError(composer, `${file.name} could not be sent to the hub; try again.`);
      return;
    }
    if (response.status !== 201 || !answered || !answered.attachment) {
      showError(composer, describe(response, answered));
      return;
    }
    const attachment = answered.attachment;
    const item = document.createElement("li");
    const remove = answerButton(`Remove ${file.name}`, async () => {
      const { response: gone, answer: why } = await send("DELETE", `${composer.dataset.uploads}/${attachment.id}`, null);
      if (!gone.ok) {
        showError(composer, describe(gone, why));
        return;
      }
      const at = pending.findIndex((a) => a.id === attachment.id);
      if (at >= 0) pending.splice(at, 1);
      item.remove();
      input.focus();
    });
    remove.className = "quiet";
    item.append(remove);
    document.getElementById("pending").append(item);
    pending.push({ id: attachment.id, name: file.name, item });
  }

  if (composer) {
    composer.addEventListener("submit", submit);
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        composer.requestSubmit();
      }
    });
    stopButton.addEventListener("click", stopTurn);
    const picker = document.getElementById("attach");
    picker.addEventListener("change", async () => {
      showError(composer, "");
      const files = Array.from(picker.files || []);
      picker.value = "";
      for (const file of files) await upload(file);
    });
  }

  readSnapshot();
  window.scrollTo(0, document.documentElement.scrollHeight);
  if (root.dataset.events) openStream();
})();
