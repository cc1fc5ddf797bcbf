package proctest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
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
