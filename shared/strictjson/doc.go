// Package strictjson is a small, strict JSON (RFC 8259) reader and writer for sluice's
// policies and plugin configuration.
//
// It exists because every Go JSON library, encoding/json included, imports fmt and so
// os, and a proxy-wasm guest built with the standard Go toolchain must not import os
// (see docs/ENVOY.md, WASI and the poll_oneoff crash). It imports only errors,
// strconv, time and unicode/utf8.
//
// # Reading
//
// [Decoder] is a pull decoder: the caller walks the document with [Decoder.Object],
// [Decoder.Array] and the typed readers ([Decoder.String], [Decoder.Uint64],
// [Decoder.Int64], [Decoder.Bool], [Decoder.Duration], [Decoder.Null], [Decoder.Skip]),
// and the decoder keeps the JSON path of the value being read (for example
// "rules[2].window") so every error names where it happened. It is stricter than
// RFC 8259 requires, on purpose:
//
//   - the document must be valid UTF-8, and \u escapes must not encode lone surrogates;
//   - a document larger than [Limits].MaxBytes bytes or nested deeper than
//     [Limits].MaxDepth arrays/objects is rejected before or while reading;
//   - duplicate keys in an object are an error (RFC 8259 §4 leaves them undefined);
//   - anything but whitespace after the top-level value is an error ([Decoder.End]);
//   - integers are range-checked into uint64/int64 exactly, without going through
//     float64; a fraction or exponent where an integer is expected is an error;
//   - durations are JSON strings in Go's time.ParseDuration syntax ("5m", "1.5s").
//
// # Errors
//
// Every error the decoder finds is an [*Error] with the JSON path, a message and the
// byte offset, and the decoder records them all in document order ([Decoder.Errors],
// [Decoder.Err]). Errors come in two kinds. A syntax error (malformed JSON, a limit
// exceeded) is sticky: the decoder cannot go on, every later call returns the same
// error, and [Error].Syntax is true. A value error (wrong type, out of range, an
// unknown field, a problem the caller reports with [Decoder.Fail]) leaves the decoder
// positioned after the offending value, so decoding goes on and one pass reports every
// problem. The typed readers return the value error they recorded (and the zero
// value); Object and Array return an error only when decoding stops, so callbacks can
// return their result directly. A callback that returns an error of its own stops
// decoding, and Err returns that error.
//
// # Writing
//
// [Writer] produces canonical, compact JSON: no insignificant whitespace, strings
// escaped minimally and always the same way ([AppendString]), integers in decimal,
// durations in a short canonical form ([AppendDuration]). The caller decides the key
// order, so a fixed-order encoder yields byte-identical output for equal values.
package strictjson
