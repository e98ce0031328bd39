// The reference TypeScript client's runner-protocol.ts with its types
// removed and nothing else changed: the client our runner must serve unchanged.

export const RUNNER_PORT = 7700;
export const RUNNER_HEALTH = "/runner/health";
export const RUNNER_PROTOCOL = 2;

export const STDIN = 0;
export const STDOUT = 1;
export const STDERR = 2;
export const FILE = 3;

export function frame(id, stream, bytes) {
  const framed = new Uint8Array(5 + bytes.length);
  new DataView(framed.buffer).setUint32(0, id);
  framed[4] = stream;
  framed.set(bytes, 5);
  return framed;
}

export const unframe = (framed) => ({
  id: new DataView(framed.buffer, framed.byteOffset, framed.byteLength).getUint32(0),
  stream: framed[4],
  bytes: framed.subarray(5),
});
