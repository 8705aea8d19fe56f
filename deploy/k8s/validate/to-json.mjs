#!/usr/bin/env node
// Prints the YAML documents read on stdin (e.g. `kubectl kustomize DIR`) as one JSON array, for
// tools that read JSON: the process-level test of deploy/k8s takes each pod's command, args,
// env and volumes from it.
import { parseAllDocuments } from "yaml";
import { readFileSync } from "node:fs";

const docs = parseAllDocuments(readFileSync(0, "utf8"));
const out = [];
for (const d of docs) {
  if (d.errors.length > 0) {
    console.error(`to-json: ${d.errors[0].message}`);
    process.exit(1);
  }
  const v = d.toJS();
  if (v !== null && v !== undefined) out.push(v);
}
process.stdout.write(JSON.stringify(out) + "\n");
