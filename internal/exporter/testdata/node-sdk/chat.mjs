// One chat completion through lanes-exporter with the official OpenAI Node
// SDK and its own retries (maxRetries 2). Used by internal/exporter's
// TestNodeSDKRetryKeepsItsPlace; prints one JSON line.
//
//   node chat.mjs <baseURL> <call id> <priority> <prompt>
import OpenAI from 'openai';

const [, , baseURL, id, priority, prompt] = process.argv;
const client = new OpenAI({ baseURL, apiKey: 'sk-node-test', maxRetries: 2, timeout: 120000 });
try {
  const res = await client.chat.completions.create(
    { model: 'protolabs/smart', messages: [{ role: 'user', content: prompt }] },
    { headers: { 'X-LLM-Priority': priority, 'X-Test-Call': id } },
  );
  console.log(JSON.stringify({ id, ok: true, content: res.choices[0].message.content }));
} catch (err) {
  console.log(JSON.stringify({ id, ok: false, status: err.status ?? 0, message: String(err.message) }));
  process.exitCode = 1;
}
