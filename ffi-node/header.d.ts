/* The typings of the `cxlkv` addon, written by `napi build` from ffi-node/src
   (this header: ffi-node/header.d.ts). Do not edit: regenerate. */

/** A key: its 16 bytes (low half first) in a Buffer or Uint8Array, or a bigint below 2**128. */
export type Key = Uint8Array | bigint
/** Keys: an array of keys, or one buffer holding 16-byte keys back to back. */
export type Keys = Key[] | Uint8Array
/** Bytes to copy from or into: a Buffer, any typed array, a DataView or an ArrayBuffer. */
export type Bytes = ArrayBufferView | ArrayBuffer
