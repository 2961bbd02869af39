#include "slm/server/web_page.h"

namespace slm::server {

const std::string& web_page_html() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SLM Ensemble chat</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;background:#fafafa}
header{padding:8px 14px;background:#233;color:#fff;display:flex;gap:12px;align-items:center}
header h1{font-size:16px;margin:0;flex:1}
#log{flex:1;overflow:auto;padding:14px}
.msg{max-width:900px;margin:0 auto 12px;padding:8px 12px;border-radius:8px;white-space:pre-wrap;font-family:ui-monospace,monospace}
.user{background:#dde8f3}.assistant{background:#fff;border:1px solid #ddd}.error{background:#fbe3e3}
.who{font:12px system-ui,sans-serif;color:#667;margin-bottom:4px}
form{display:flex;gap:8px;padding:10px 14px;border-top:1px solid #ddd;background:#fff}
textarea{flex:1;height:64px;font:14px ui-monospace,monospace}
</style></head><body>
<header><h1>SLM Ensemble</h1>
<label>model <select id="model"></select></label>
<label>max tokens <input id="max" type="number" value="256" min="1" style="width:5em"></label>
<label>temperature <input id="temp" type="number" value="0.7" step="0.1" min="0" max="2" style="width:4em"></label>
<input id="key" type="password" placeholder="API key (if any)" style="width:9em"></header>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Ask the C++ specialists... (Ctrl+Enter sends)"></textarea>
<button id="send">Send</button></form>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
const history = [];
function headers() {
  const h = {'Content-Type': 'application/json'}, k = document.getElementById('key').value;
  if (k) h['Authorization'] = 'Bearer ' + k;
  return h;
}
function bubble(cls, who) {
  const d = document.createElement('div'); d.className = 'msg ' + cls;
  const w = document.createElement('div'); w.className = 'who'; w.textContent = who; d.appendChild(w);
  const t = document.createElement('span'); d.appendChild(t); log.appendChild(d); return {d, w, t};
}
async function loadModels() {
  const sel = document.getElementById('model');
  try {
    const r = await fetch('/v1/models', {headers: headers()}); const j = await r.json();
    sel.innerHTML = '';
    for (const m of j.data) { const o = document.createElement('option'); o.value = o.textContent = m.id; sel.appendChild(o); }
    if ([...sel.options].some(o => o.value === 'auto')) sel.value = 'auto';
  } catch (e) { bubble('error', 'error').t.textContent = 'cannot list models: ' + e; }
}
async function send(text) {
  history.push({role: 'user', content: text});
  bubble('user', 'you').t.textContent = text;
  const out = bubble('assistant', 'assistant');
  const body = {model: document.getElementById('model').value, messages: history, stream: true,
                max_tokens: +document.getElementById('max').value, temperature: +document.getElementById('temp').value};
  let answer = '';
  try {
    const r = await fetch('/v1/chat/completions', {method: 'POST', headers: headers(), body: JSON.stringify(body)});
    if (!r.ok) { const j = await r.json(); throw new Error(j.error ? j.error.message : r.statusText); }
    out.w.textContent = 'assistant: ' + (r.headers.get('X-SLM-Specialist') || '?');
    const reader = r.body.getReader(), dec = new TextDecoder(); let buf = '';
    for (;;) {
      const {value, done} = await reader.read(); if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith('data: ')) continue;
        const data = ev.slice(6); if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        const d = j.choices.length ? j.choices[0].delta : null;
        if (d && d.content) { answer += d.content; out.t.textContent = answer; log.scrollTop = log.scrollHeight; }
      }
    }
    history.push({role: 'assistant', content: answer});
  } catch (e) { out.d.className = 'msg error'; out.t.textContent = answer + '\n[' + e.message + ']'; history.pop(); }
}
document.getElementById('form').addEventListener('submit', e => {
  e.preventDefault(); const t = input.value.trim(); if (!t) return; input.value = ''; send(t);
});
input.addEventListener('keydown', e => { if (e.key === 'Enter' && e.ctrlKey) document.getElementById('form').requestSubmit(); });
loadModels();
</script></body></html>
)HTML";
  return page;
}

}  // namespace slm::server
