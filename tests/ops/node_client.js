// A Node gRPC client (@grpc/grpc-js + @grpc/proto-loader from npm) that knows gigacluster only through
// the descriptor set `gigacluster protos --out DIR` writes. Usage: node node_client.js SET ENDPOINT KEY.
// Prints one JSON object: a call that succeeds (ListQueues), the health check, and a call that fails
// (GetJob of a missing job) with its google.rpc.Status and ErrorInfo decoded from the trailer.
"use strict";
const fs = require("fs");
const grpc = require("@grpc/grpc-js");
const loader = require("@grpc/proto-loader");
const protobuf = require("protobufjs");
require("protobufjs/ext/descriptor");

const [setPath, endpoint, key] = process.argv.slice(2);
const raw = fs.readFileSync(setPath);
const pkg = grpc.loadPackageDefinition(loader.loadFileDescriptorSetFromBuffer(raw, { defaults: true, enums: String }));
const root = protobuf.Root.fromDescriptor(raw);
const creds = grpc.credentials.createInsecure();
const md = new grpc.Metadata();
md.set("authorization", `Bearer ${key}`);

const call = (client, method, req) =>
  new Promise((resolve) => client[method](req, md, (err, res) => resolve({ err, res })));

function decodeDetails(err) {
  const [bin] = err.metadata.get("grpc-status-details-bin");
  const status = root.lookupType("google.rpc.Status").decode(bin);
  return status.details.map((any) => {
    const typeName = any.type_url.slice(any.type_url.lastIndexOf("/") + 1);
    const msg = root.lookupType(typeName).decode(any.value);
    return { type: typeName, value: root.lookupType(typeName).toObject(msg) };
  });
}

(async () => {
  const sched = new pkg.gigacluster.scheduler.v1.SchedulerService(endpoint, creds);
  const health = new pkg.grpc.health.v1.Health(endpoint, creds);
  const ok = await call(sched, "ListQueues", {});
  const hc = await call(health, "Check", { service: "" });
  const bad = await call(sched, "GetJob", { name: "jobs/j-999999" });
  const out = {
    ok: { error: ok.err ? ok.err.message : null, queues: ok.res ? ok.res.queues.length : null },
    health: hc.err ? hc.err.message : hc.res.status,
    fail: bad.err ? { code: bad.err.code, details: bad.err.details, decoded: decodeDetails(bad.err) } : null,
  };
  console.log(JSON.stringify(out));
  sched.close();
  health.close();
})();
