// One chat completion through lanes-exporter with the official OpenAI Node
// SDK and its own retries (maxRetries 2). Used by internal/exporter's
// TestNodeSDKRetryKeepsItsPlace and TestNodeSDKDeadline; prints one JSON
// line.
//
//   node chat.mjs <baseURL> <call id> <priority> <prompt> [timeout in ms, 0: none] [stream]
import OpenAI from 'openai';

const [, , baseURL, id, priority, prompt, timeout, stream] = process.argv;
const client = new OpenAI({ baseURL, apiKey: 'sk-node-test', maxRetries: 2, timeout: 120000 });
// openai-node states a timeout (X-Stainless-Timeout) only when it is given
// per request, as here; a client-wide one is not sent.
const perRequest = Number(timeout) > 0 ? { timeout: Number(timeout) } : {};
try {
  const res = await client.chat.completions.create(
    { model: 'protolabs/smart', messages: [{ role: 'user', content: prompt }], ...(stream ? { stream: true } : {}) },
    { headers: { 'X-LLM-Priority': priority, 'X-Test-Call': id }, ...perRequest },
  );
  let content = '';
  if (stream) {
    for await (const chunk of res) content += chunk.choices[0]?.delta?.content ?? '';
  } else {
    content = res.choices[0].message.content;
  }
  console.log(JSON.stringify({ id, ok: true, content }));
} catch (err) {
  console.log(JSON.stringify({ id, ok: false, status: err.status ?? 0, code: err.code ?? '', type: err.constructor.name, message: String(err.message) }));
  process.exitCode = 1;
}
