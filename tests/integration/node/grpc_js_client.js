// Deckard's ten methods, health and reflection through @grpc/grpc-js (Node's gRPC, written
// without any of the server's code): prints what each call answered, as JSON.
//
//   node grpc_js_client.js PORT DESCRIPTORS DECKARD_PROTO [CA_FILE] [TOKEN]
//
// DESCRIPTORS: a FileDescriptorSet of health.proto and reflection.proto (the Python packages
// ship them compiled only); DECKARD_PROTO: proto/deckard_service.proto.
'use strict';
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [port, descriptors, deckardProto, caFile, token] = process.argv.slice(2);
const loading = {keepCase: true, longs: String, enums: String, defaults: true};
const deckard = grpc.loadPackageDefinition(protoLoader.loadSync(deckardProto, loading)).blipai.deckard;
const standard = protoLoader.loadFileDescriptorSetFromBuffer(fs.readFileSync(descriptors), loading);
const std = grpc.loadPackageDefinition(standard);
const credentials = caFile ? grpc.credentials.createSsl(fs.readFileSync(caFile)) : grpc.credentials.createInsecure();
const target = `127.0.0.1:${port}`;
const authorized = new grpc.Metadata();
if (token) authorized.set('authorization', `Bearer ${token}`);

function call(client, method, request, metadata = authorized) {
  return new Promise((resolve) => {
    client[method](request, metadata, {deadline: Date.now() + 20000}, (err, answer) => {
      resolve(err ? {code: err.code, details: err.details} : {ok: answer});
    });
  });
}

// A bidirectional call by path with reflection's (de)serializers: v1 has the same messages as v1alpha.
function reflect(client, path, request) {
  const info = standard['grpc.reflection.v1alpha.ServerReflection'].ServerReflectionInfo;
  return new Promise((resolve) => {
    const stream = client.makeBidiStreamRequest(path, info.requestSerialize, info.responseDeserialize,
      authorized, {deadline: Date.now() + 20000});
    stream.on('data', (answer) => { resolve({ok: answer}); stream.cancel(); });
    stream.on('error', (err) => { if (err.code !== grpc.status.CANCELLED) resolve({code: err.code, details: err.details}); });
    stream.write(request);
  });
}

function watchFirst(health) {
  return new Promise((resolve) => {
    const stream = health.Watch({service: ''}, new grpc.Metadata(), {deadline: Date.now() + 20000});
    stream.on('data', (answer) => { resolve({ok: answer}); stream.cancel(); });
    stream.on('error', (err) => { if (err.code !== grpc.status.CANCELLED) resolve({code: err.code, details: err.details}); });
  });
}

async function main() {
  const out = {};
  const client = new deckard.Deckard(target, credentials);
  const queue = `grpcjs::${Math.random().toString(36).slice(2, 12)}`;
  const any = {type_url: 'type.googleapis.com/google.protobuf.StringValue', value: Buffer.from([0x0a, 0x02, 0x68, 0x69])};
  out.add = await call(client, 'Add', {messages: [
    {id: 'a', queue, string_payload: 'one', score: 10, ttl_minutes: 10},
    {id: 'b', queue, payload: {p: any}, metadata: {k: 'v'}, score: 20, ttl_minutes: 10},
  ]});
  out.count = await call(client, 'Count', {queue});
  out.get_by_id = await call(client, 'GetById', {queue, id: 'b'});
  out.pull_first = await call(client, 'Pull', {queue, amount: 1});
  out.ack = await call(client, 'Ack', {queue, id: 'a'});
  out.pull_second = await call(client, 'Pull', {queue, amount: 5, min_score: 15, max_score: 25});
  out.nack = await call(client, 'Nack', {queue, id: 'b'});
  out.remove = await call(client, 'Remove', {queue, ids: ['a', 'b', 'never']});
  out.edit_queue = await call(client, 'EditQueue', {queue, configuration: {max_elements: 5}});
  out.get_queue = await call(client, 'GetQueue', {queue});
  out.invalid = await call(client, 'Add', {messages: [{id: '', queue}]});
  const big = 'x'.repeat(1 << 20);
  out.big_add = await call(client, 'Add', {messages: [{id: 'big', queue, string_payload: big, ttl_minutes: 10}]});
  const pulled = await call(client, 'Pull', {queue, amount: 1});
  out.big_pull = pulled.ok ? {ok: pulled.ok.messages.map((m) => m.string_payload.length)} : pulled;
  const gzipped = new deckard.Deckard(target, credentials, {'grpc.default_compression_algorithm': 2});
  out.gzip_count = await call(gzipped, 'Count', {queue});
  gzipped.close();
  out.flush = await call(client, 'Flush', {});
  out.unknown = await new Promise((resolve) => {
    client.makeUnaryRequest('/blipai.deckard.Deckard/Nope', (x) => x, (x) => x, Buffer.alloc(0), authorized,
      {deadline: Date.now() + 20000}, (err) => resolve(err ? {code: err.code} : {ok: true}));
  });
  if (token) out.no_token = await call(client, 'Count', {queue}, new grpc.Metadata());
  client.close();

  const health = new std.grpc.health.v1.Health(target, credentials);
  out.health = await call(health, 'Check', {service: ''}, new grpc.Metadata());
  out.health_unknown = await call(health, 'Check', {service: 'nope'}, new grpc.Metadata());
  out.watch = await watchFirst(health);
  health.close();

  const generic = new grpc.Client(target, credentials);
  for (const version of ['v1alpha', 'v1']) {
    const answer = await reflect(generic, `/grpc.reflection.${version}.ServerReflection/ServerReflectionInfo`,
      {host: '', list_services: '*'});
    out[`reflection_${version}`] = answer.ok
      ? {ok: answer.ok.list_services_response.service.map((s) => s.name).sort()} : answer;
  }
  generic.close();
  process.stdout.write(JSON.stringify(out));
}

main().catch((err) => { process.stderr.write(String(err.stack || err)); process.exit(1); });
