package proxywasm

// Getenv returns the value of the VM environment variable name and whether it
// is set. The environment is what Envoy's vm_config.environment_variables gives
// the VM (host_env_keys: copied from the Envoy process's own environment;
// key_values: literal), read with WASI environ_sizes_get and environ_get (WASI
// preview 1, wasi_snapshot_preview1.witx) at each call, not through package os,
// which the filter must not import (docs/ENVOY.md). Entries are "NAME=value"; a
// name that appears twice takes its first value, as getenv(3) does.
func Getenv(name string) (string, bool) {
	for _, e := range hostEnviron() {
		if len(e) > len(name) && e[len(name)] == '=' && e[:len(name)] == name {
			return e[len(name)+1:], true
		}
	}
	return "", false
}
