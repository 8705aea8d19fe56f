#!/usr/bin/env node
// Validates rendered Kubernetes manifests (the output of `kubectl kustomize`) offline: every
// built-in object against the Kubernetes API schema that the kubernetes-models package compiles
// from the OpenAPI specification (types, required fields, enums, quantities and other formats),
// and every PyTorchJob against the Kubeflow training-operator's v1 schema kept beside this file
// (unknown fields rejected) plus the operator's own admission rules, with each replica's pod
// template checked as a core/v1 PodTemplateSpec. Prints one line per object, and for each
// problem the file, object and field; exits 1 when anything is invalid, 2 on bad usage.
//
//   kubectl kustomize deploy/k8s/indexed-job/overlays/cpu | node validate.mjs -
//   node validate.mjs rendered.yaml [more.yaml ...]
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));

async function builtinModel(apiVersion, kind) {
  // "v1" -> kubernetes-models/v1/Kind; "batch/v1" -> kubernetes-models/batch/v1/Kind
  const path = `kubernetes-models/${apiVersion}/${kind}`;
  try {
    const mod = await import(path);
    return mod[kind];
  } catch {
    return null;
  }
}

function describeErrors(errors) {
  return errors.map((e) => `${e.instancePath || "/"} ${e.message}`).join("; ");
}

async function validatePodTemplate(template, where, problems) {
  const { PodTemplateSpec } = await import("kubernetes-models/v1/PodTemplateSpec");
  try {
    new PodTemplateSpec(template).validate();
  } catch (e) {
    problems.push(`${where}: ${String(e.message ?? e)}`);
  }
}

const ajv = new Ajv({ allErrors: true, strict: true });
const pytorchJob = ajv.compile(
  JSON.parse(readFileSync(join(here, "pytorchjob-v1.schema.json"), "utf8")),
);

async function validatePyTorchJob(obj, problems) {
  if (!pytorchJob(obj)) problems.push(describeErrors(pytorchJob.errors));
  const specs = obj?.spec?.pytorchReplicaSpecs ?? {};
  // The operator's admission rules (training-operator ValidateV1PyTorchJob).
  if (specs.Master && (specs.Master.replicas ?? 1) !== 1)
    problems.push("/spec/pytorchReplicaSpecs/Master/replicas must be 1");
  for (const [type, spec] of Object.entries(specs)) {
    const base = `/spec/pytorchReplicaSpecs/${type}/template`;
    if (spec?.template === undefined) continue;
    await validatePodTemplate(spec.template, base, problems);
    const containers = spec.template?.spec?.containers ?? [];
    if (!containers.some((c) => c.name === "pytorch"))
      problems.push(`${base}/spec/containers: no container is named "pytorch" (the operator ` +
        `reads the rendezvous port from it)`);
  }
}

async function validateObject(obj, problems) {
  if (obj === null || typeof obj !== "object") {
    problems.push("not an object");
    return;
  }
  const { apiVersion, kind } = obj;
  if (apiVersion === "kubeflow.org/v1" && kind === "PyTorchJob") {
    await validatePyTorchJob(obj, problems);
    return;
  }
  const Model = await builtinModel(apiVersion, kind);
  if (Model === null) {
    problems.push(`no schema for ${apiVersion} ${kind}`);
    return;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    problems.push(String(e.message ?? e));
  }
}

async function main(args) {
  if (args.length === 0 || args.includes("--help")) {
    console.error("usage: validate.mjs FILE.yaml|- [FILE.yaml ...]");
    return 2;
  }
  let bad = 0;
  let count = 0;
  for (const file of args) {
    const text = readFileSync(file === "-" ? 0 : file, "utf8");
    const docs = parseAllDocuments(text);
    for (const doc of docs) {
      if (doc.errors.length > 0) {
        console.log(`${file}: YAML error: ${doc.errors[0].message}`);
        ++bad;
        continue;
      }
      const obj = doc.toJS();
      if (obj === null) continue;
      ++count;
      const name = `${obj.kind ?? "?"}/${obj.metadata?.name ?? "?"}`;
      const problems = [];
      await validateObject(obj, problems);
      if (problems.length === 0) {
        console.log(`${file}: ${obj.apiVersion} ${name}: valid`);
      } else {
        ++bad;
        for (const p of problems) console.log(`${file}: ${obj.apiVersion} ${name}: INVALID ${p}`);
      }
    }
  }
  if (count === 0) {
    console.log("no objects to validate");
    return 1;
  }
  console.log(`${count} objects, ${bad} invalid`);
  return bad === 0 ? 0 : 1;
}

process.exitCode = await main(process.argv.slice(2));
