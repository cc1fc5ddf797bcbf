// Package strictjson is a small, strict JSON (RFC 8259) reader and writer for sluice's
// policies and plugin configuration.
//
// It exists because every Go JSON library, encoding/json included, imports fmt and so
// os, and a proxy-wasm guest built with the standard Go toolchain must not import os
// (see DESIGN.md §2). It imports only errors, strconv, time and unicode/utf8.
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
// Every error returned by the decoder is an [*Error] with the JSON path, a message and
// the byte offset. Errors come in two kinds. A syntax error (malformed JSON, a limit
// exceeded) is sticky: the decoder cannot go on, and every later call returns the same
// error; [Error].Syntax is true. A value error (wrong type, out of range, unknown field
// reported through [Decoder.UnknownField]) leaves the decoder positioned after the
// offending value, so a caller that wants to report every problem at once can record it,
// return nil from its callback and carry on.
//
// # Writing
//
// [Writer] produces canonical, compact JSON: no insignificant whitespace, strings
// escaped minimally and always the same way ([AppendString]), integers in decimal,
// durations in a short canonical form ([AppendDuration]). The caller decides the key
// order, so a fixed-order encoder yields byte-identical output for equal values.
package strictjson
