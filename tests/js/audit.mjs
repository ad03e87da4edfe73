// Runs graphql-http's own conformance audit (`auditServer`) against a server
// and prints one JSON line per audit: {id, name, status, reason}.
//   node audit.mjs <http url of /graphql> [<token>]
// With a token, every request the audit sends carries it as a bearer token.
import { auditServer } from "graphql-http";

const [url, token] = process.argv.slice(2);
const fetchFn = token
  ? (input, init = {}) => {
      const headers = new Headers(init.headers);
      headers.set("authorization", `Bearer ${token}`);
      return fetch(input, { ...init, headers });
    }
  : fetch;

const results = await auditServer({ url, fetchFn });
for (const result of results) {
  const line = { id: result.id, name: result.name, status: result.status };
  if (result.status !== "ok") line.reason = result.reason;
  process.stdout.write(JSON.stringify(line) + "\n");
}
