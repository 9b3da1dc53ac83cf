// One message through lanes-exporter with the official Anthropic Node SDK
// and its own retries (maxRetries 2). Used by internal/exporter's
// TestAnthropicClients; prints one JSON line.
//
//   node anthropic.mjs <baseURL> <call as JSON: id, model, prompt, max_tokens, stream, tenant, priority, timeout (s)>
import Anthropic from '@anthropic-ai/sdk';

const [, , baseURL, spec] = process.argv;
const c = JSON.parse(spec);
const client = new Anthropic({ baseURL, apiKey: 'sk-ant-node-test', maxRetries: 2, timeout: (c.timeout || 120) * 1000 });
const headers = { 'X-Test-Call': c.id };
if (c.tenant) headers['X-LLM-Tenant'] = c.tenant;
if (c.priority) headers['X-LLM-Priority'] = c.priority;
const params = { model: c.model, max_tokens: c.max_tokens, messages: [{ role: 'user', content: c.prompt }] };
try {
  const msg = c.stream
    ? await client.messages.stream(params, { headers }).finalMessage()
    : await client.messages.create(params, { headers });
  const text = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  console.log(JSON.stringify({ ok: true, input: msg.usage.input_tokens, output: msg.usage.output_tokens, text }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, status: err.status ?? 0, message: String(err.message) }));
  process.exitCode = 1;
}
