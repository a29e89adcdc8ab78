// The ds4py chat page: streams /v1/chat/completions (SSE) and shows the reply,
// reasoning in a collapsible block, a Stop button and tok/s after each reply.
"use strict";
const log = document.getElementById("log");
const input = document.getElementById("input");
const sendBtn = document.getElementById("send");
const stopBtn = document.getElementById("stop");
const stats = document.getElementById("stats");
const history = [];
let controller = null;

fetch("/v1/models").then(r => r.json()).then(j => {
  if (j.data) document.getElementById("model").textContent = "— " + j.data[0].id;
}).catch(() => {});

function add(cls, text) {
  const div = document.createElement("div");
  div.className = "msg " + cls;
  div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}

async function send(text) {
  history.push({ role: "user", content: text });
  add("user", text);
  const box = add("assistant", "");
  const details = document.createElement("details");
  details.className = "reasoning";
  details.innerHTML = "<summary>reasoning</summary>";
  const reasoning = document.createElement("div");
  details.appendChild(reasoning);
  const content = document.createElement("div");
  content.className = "content";
  box.appendChild(content);
  controller = new AbortController();
  sendBtn.disabled = true; stopBtn.disabled = false; stats.textContent = "";
  const t0 = performance.now();
  let tFirst = 0, nTokens = 0, reply = "";
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", signal: controller.signal,
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        messages: history, stream: true, stream_options: { include_usage: true },
        temperature: parseFloat(document.getElementById("temp").value),
        max_tokens: parseInt(document.getElementById("maxtok").value, 10),
      }),
    });
    if (!r.ok) { content.textContent = "error: " + (await r.text()); return; }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const ev = JSON.parse(line.slice(6));
        if (ev.usage) nTokens = ev.usage.completion_tokens;
        const d = ev.choices && ev.choices[0] && ev.choices[0].delta;
        if (!d) continue;
        if ((d.reasoning_content || d.content) && !tFirst) tFirst = performance.now();
        if (d.reasoning_content) {
          if (!details.parentNode) box.insertBefore(details, content);
          reasoning.textContent += d.reasoning_content;
        }
        if (d.content) {
          reply += d.content;
          content.textContent = reply;
          log.scrollTop = log.scrollHeight;
        }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") content.textContent += "\n[error: " + e + "]";
    else content.textContent += " [stopped]";
  } finally {
    const secs = (performance.now() - (tFirst || t0)) / 1000;
    history.push({ role: "assistant", content: reply });
    stats.textContent = nTokens && secs > 0 ? (nTokens / secs).toFixed(1) + " tok/s" : "";
    sendBtn.disabled = false; stopBtn.disabled = true; controller = null;
  }
}

document.getElementById("form").addEventListener("submit", e => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = "";
  send(text);
});
input.addEventListener("keydown", e => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); document.getElementById("form").requestSubmit(); }
});
stopBtn.addEventListener("click", () => { if (controller) controller.abort(); });
