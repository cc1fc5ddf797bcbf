package proctest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Build is one `go build` for TestMain.
type Build struct {
	Env  []string // "KEY=value" entries added to the environment, e.g. "GOOS=wasip1"
	Args []string // what follows "go build": flags, "-o" path and the package
}

// BuildAll runs the builds at once in dir (the module root) and waits for
// all of them. Its error joins one error per failed build, naming the
// arguments and quoting the go command's output.
func BuildAll(dir string, builds ...Build) error {
	errs := make([]error, len(builds))
	var wg sync.WaitGroup
	for i, b := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command("go", append([]string{"build"}, b.Args...)...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), b.Env...)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go build %s: %v\n%s", strings.Join(b.Args, " "), err, out)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// MainWithFilterAndControlPlane is the TestMain of a suite that runs the real
// filter module in the testenv host against the real control-plane binary:
// it builds sluice.wasm (GOOS=wasip1 GOARCH=wasm, -buildmode=c-shared) and
// sluice-controlplane from the module root (ModuleRoot: the nearest directory holding go.mod) into a temporary directory, hands them to set (the module's bytes
// and the binary's path), runs the tests and exits with their code, or with 1
// and the build's output when a build fails. It does not return.
func MainWithFilterAndControlPlane(m *testing.M, set func(wasm []byte, cpBin string)) {
	code, err := runWithFilterAndControlPlane(m, set)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func runWithFilterAndControlPlane(m *testing.M, set func(wasm []byte, cpBin string)) (int, error) {
	dir, err := os.MkdirTemp("", "sluice-suite")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	root, err := ModuleRoot()
	if err != nil {
		return 1, err
	}
	wasmPath, cpBin := filepath.Join(dir, "sluice.wasm"), filepath.Join(dir, "sluice-controlplane")
	if err := BuildAll(root,
		Build{Env: []string{"GOOS=wasip1", "GOARCH=wasm"}, Args: []string{"-buildmode=c-shared", "-o", wasmPath, "./filter"}},
		Build{Args: []string{"-o", cpBin, "./controlplane/cmd/sluice-controlplane"}},
	); err != nil {
		return 1, err
	}
	wasm, err := os.ReadFile(wasmPath)
	if err != nil {
		return 1, err
	}
	set(wasm, cpBin)
	return m.Run(), nil
}

// MainWithBinaries is the TestMain of a suite that runs the real binaries: it
// builds sluice.wasm (GOOS=wasip1 GOARCH=wasm, -buildmode=c-shared) and each
// command of cmds (packages relative to the module root, such as
// "./controlplane/cmd/sluice-controlplane", each built as its last path
// element), all with -trimpath, from the module root (ModuleRoot) into a temporary directory. It hands set that directory
// and the module root, runs the tests, removes the directory and exits with
// the tests' code, or with 1 and the error when a build or set fails. It does
// not return.
func MainWithBinaries(m *testing.M, cmds []string, set func(binDir, root string) error) {
	code, err := runWithBinaries(m, cmds, set)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func runWithBinaries(m *testing.M, cmds []string, set func(binDir, root string) error) (int, error) {
	root, err := ModuleRoot()
	if err != nil {
		return 1, err
	}
	dir, err := os.MkdirTemp("", "sluice-bin")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	builds := []Build{{Env: []string{"GOOS=wasip1", "GOARCH=wasm"},
		Args: []string{"-trimpath", "-buildmode=c-shared", "-o", filepath.Join(dir, "sluice.wasm"), "./filter"}}}
	for _, c := range cmds {
		builds = append(builds, Build{Args: []string{"-trimpath", "-o", filepath.Join(dir, filepath.Base(c)), c}})
	}
	if err := BuildAll(root, builds...); err != nil {
		return 1, err
	}
	if err := set(dir, root); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// ModuleRoot returns the module's root directory: the nearest directory at or
// above the working directory (a test's package directory) that holds go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("proctest: no go.mod at or above the working directory")
		}
		dir = up
	}
}
