// A client this project did not write (the MCP TypeScript SDK, pinned in package.json) against
// `rag serve`: lists the tools, calls lookup_knowledge once per query and prints one JSON object
// on stdout: {"sdk": "<version>", "server": serverInfo, "tools": [names], "templates": [uriTemplate],
// "answers": {query: [docId, ...]}, "errors": {query: text}}. Used by tests/test_serve_integration.py.
//
//   node lookup_client.mjs --http http://127.0.0.1:PORT/mcp [--token T] QUERY...
//   node lookup_client.mjs --stdio COMMAND [ARG...] -- QUERY...
// The stdio child gets the environment of this process (RAG_* settings included).
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

function usage(message) {
  process.stderr.write(`lookup_client.mjs: ${message}\n`);
  process.exit(2);
}

function parse(argv) {
  const [mode, ...rest] = argv;
  if (mode === "--http") {
    const [url, ...more] = rest;
    if (!url) usage("--http needs the MCP URL");
    let token = process.env.RAG_SERVE_TOKEN || "";
    if (more[0] === "--token") {
      token = more[1] || "";
      more.splice(0, 2);
    }
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    return { transport: new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }), queries: more };
  }
  if (mode === "--stdio") {
    const cut = rest.indexOf("--");
    if (cut < 1) usage("--stdio needs COMMAND [ARG...] -- QUERY...");
    const [command, ...args] = rest.slice(0, cut);
    const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: "inherit" });
    return { transport, queries: rest.slice(cut + 1) };
  }
  return usage("first argument: --http URL or --stdio COMMAND");
}

async function main() {
  const { transport, queries } = parse(process.argv.slice(2));
  if (queries.length === 0) usage("no query given");
  const sdkPackage = new URL("./node_modules/@modelcontextprotocol/sdk/package.json", import.meta.url);
  const sdk = JSON.parse(readFileSync(sdkPackage, "utf8")).version;
  const client = new Client({ name: "rag-serve-js-test", version: "1.0.0" });
  await client.connect(transport);
  try {
    const tools = (await client.listTools()).tools.map((t) => t.name);
    const templates = (await client.listResourceTemplates()).resourceTemplates.map((t) => t.uriTemplate);
    const answers = {};
    const errors = {};
    for (const query of queries) {
      const result = await client.callTool({ name: "lookup_knowledge", arguments: { query } });
      if (result.isError) errors[query] = result.content.map((c) => c.text ?? "").join("\n");
      // The SDK validates structuredContent against the tool's outputSchema before returning it.
      answers[query] = (result.structuredContent?.evidenceBlocks ?? []).map((b) => b.docId);
    }
    const server = client.getServerVersion();
    process.stdout.write(JSON.stringify({ sdk, server, tools, templates, answers, errors }) + "\n");
  } finally {
    await client.close();
  }
}

main().catch((err) => {
  process.stderr.write(`lookup_client.mjs: ${err?.stack || err}\n`);
  process.exit(1);
});
