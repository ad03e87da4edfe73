// Subscribes with graphql-ws (the client most frontends use) and prints each
// result as one JSON line; the Python tests read the lines.
//   node subscribe.mjs <ws url> <token> <query> <variables JSON> <how many>
// A line {"ready": true} says the subscription was sent on an acknowledged
// connection; {"error": ...} ends the run with exit code 1.
import { createClient } from "graphql-ws";
import WebSocket from "ws";

const [url, token, query, variables, count] = process.argv.slice(2);
const wanted = Number(count);
const print = (value) => process.stdout.write(JSON.stringify(value) + "\n");

const client = createClient({
  url,
  webSocketImpl: WebSocket,
  connectionParams: { Authorization: `Bearer ${token}` },
  retryAttempts: 0,
  on: { connected: () => print({ ready: true }) },
});

let seen = 0;
const done = (code) => {
  client.dispose();
  process.exit(code);
};
client.subscribe(
  { query, variables: JSON.parse(variables) },
  {
    next: (result) => {
      print(result);
      seen += 1;
      if (seen >= wanted) done(0);
    },
    error: (error) => {
      print({ error: String(error?.message ?? error?.reason ?? JSON.stringify(error)) });
      done(1);
    },
    complete: () => done(seen >= wanted ? 0 : 1),
  },
);
