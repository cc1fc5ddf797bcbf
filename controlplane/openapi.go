// Package controlplane holds what describes the control plane as a whole:
// its OpenAPI 3 document. The service itself lives in internal/ packages and
// the binary in cmd/sluice-controlplane.
package controlplane

import _ "embed"

// OpenAPI is the OpenAPI 3.0 document (YAML) of the REST API, openapi.yaml.
// The tests validate every response they receive against it.
//
//go:embed openapi.yaml
var OpenAPI []byte
