package rlsdeploy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/testenv/testkit/modcache"
)

// The guides whose Deployment of envoyproxy/ratelimit envoy/ patches: each
// project's own manifest, read from its module in the Go module cache.
var guides = []struct {
	name            string
	module, version string
	deployment      string // the file with the Deployment "ratelimit"
	configMap       string // the file with its rules' ConfigMap, "" if in deployment's
	patch           string // envoy/'s strategic-merge patch
}{
	{name: "Contour", module: "github.com/projectcontour/contour", version: "v1.33.8",
		deployment: "examples/ratelimit/02-ratelimit.yaml", configMap: "examples/ratelimit/01-ratelimit-config.yaml",
		patch: "envoy/contour/ratelimit-image.patch.yaml"},
	{name: "Istio", module: "istio.io/istio", version: "v0.0.0-20260827124520-eed52ebb66ad",
		deployment: "samples/ratelimit/rate-limit-service.yaml", patch: "envoy/istio/ratelimit-image.patch.yaml"},
}

// TestTheGuidesDeploymentsRunWithOnlyTheImageChanged applies each of envoy/'s
// image patches to the Deployment of the guide it names (Contour's global
// rate limiting example, Istio's rate limit sample, as their projects ship
// them) and checks that the image is all it changes, and that the patched
// container runs: its command is the image's /bin/ratelimit, and its
// environment, with only the addresses made the test's (Redis, the
// listeners, RUNTIME_ROOT), starts both services on the guide's own rules
// and both answer a call on them alike.
func TestTheGuidesDeploymentsRunWithOnlyTheImageChanged(t *testing.T) {
	for _, g := range guides {
		t.Run(g.name, func(t *testing.T) {
			dir := modcache.Dir(t, g.module, g.version)
			orig := findDoc(t, filepath.Join(dir, g.deployment), "Deployment", "ratelimit")
			patch, err := os.ReadFile(filepath.Join(repoRoot(t), g.patch))
			if err != nil {
				t.Fatal(err)
			}
			origJSON, err := yaml.YAMLToJSON(orig)
			if err != nil {
				t.Fatal(err)
			}
			patchJSON, err := yaml.YAMLToJSON(patch)
			if err != nil {
				t.Fatal(err)
			}
			merged, err := strategicpatch.StrategicMergePatch(origJSON, patchJSON, appsv1.Deployment{})
			if err != nil {
				t.Fatalf("%s does not apply: %v", g.patch, err)
			}
			var before, after, want appsv1.Deployment
			for _, d := range []struct {
				b   []byte
				out *appsv1.Deployment
			}{{origJSON, &before}, {merged, &after}, {patchJSON, &want}} {
				if err := yaml.Unmarshal(d.b, d.out); err != nil {
					t.Fatal(err)
				}
			}
			c := container(t, &after, "ratelimit")
			if wantImage := container(t, &want, "ratelimit").Image; c.Image != wantImage {
				t.Fatalf("patched image %q, want %q", c.Image, wantImage)
			}
			container(t, &before, "ratelimit").Image = c.Image
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("%s changes more than the image:\nbefore %+v\nafter  %+v", g.patch, before.Spec.Template.Spec, after.Spec.Template.Spec)
			}
			if !reflect.DeepEqual(c.Command, []string{"/bin/ratelimit"}) {
				t.Fatalf("command %q: the image's /bin/ratelimit is what runs sluice as the service", c.Command)
			}
			rules := guideRules(t, dir, g.configMap, g.deployment)
			var env []string
			for _, e := range c.Env {
				switch e.Name {
				case "REDIS_URL", "RUNTIME_ROOT", "HOST", "PORT", "GRPC_HOST", "GRPC_PORT", "DEBUG_HOST", "DEBUG_PORT":
					// the test's addresses (deploy)
				default:
					env = append(env, e.Name+"="+e.Value)
				}
			}
			answers := map[string]string{}
			for _, im := range impls {
				root := t.TempDir()
				(&configMap{dir: filepath.Join(root, "ratelimit", "config")}).put(t, rules)
				d := deploy(t, im, root, nil, env...)
				resp, err := d.call(domainOf(t, rules), 1, firstDescriptor(t, rules)...)
				if err != nil {
					t.Fatalf("%s: %v", im.name, err)
				}
				answers[im.name] = resp.GetOverallCode().String() + " " + resp.GetStatuses()[0].GetCurrentLimit().String()
			}
			if a, b := answers[impls[0].name], answers[impls[1].name]; a != b || !strings.Contains(a, "requests_per_unit") {
				t.Errorf("a call on %s's rules: envoyproxy/ratelimit %q, sluice %q", g.name, a, b)
			}
			t.Logf("%s: %v", g.name, answers)
		})
	}
}

// findDoc returns the document of kind and name in a multi-document YAML file.
func findDoc(t *testing.T, file, kind, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range strings.Split(string(b), "\n---") {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if yaml.Unmarshal([]byte(part), &m) == nil && m.Kind == kind && m.Metadata.Name == name {
			return []byte(part)
		}
	}
	t.Fatalf("%s: no %s %q", file, kind, name)
	return nil
}

func container(t *testing.T, d *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// guideRules returns the files of the guide's ConfigMap "ratelimit-config";
// without one (Istio's sample leaves it to the task), the rules of the
// comment the sample gives as an example.
func guideRules(t *testing.T, dir, configMapFile, deploymentFile string) map[string]string {
	t.Helper()
	if configMapFile != "" {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(findDoc(t, filepath.Join(dir, configMapFile), "ConfigMap", "ratelimit-config"), &cm); err != nil {
			t.Fatal(err)
		}
		return cm.Data
	}
	b, err := os.ReadFile(filepath.Join(dir, deploymentFile))
	if err != nil {
		t.Fatal(err)
	}
	// The sample's header comment: "#  data:\n#    config.yaml: |\n#      domain: ...".
	_, rest, ok := strings.Cut(string(b), "#    config.yaml: |\n")
	if !ok {
		t.Fatalf("%s: no example ConfigMap in its comment", deploymentFile)
	}
	var lines []string
	for _, l := range strings.Split(rest, "\n") {
		body, ok := strings.CutPrefix(l, "#      ")
		if !ok {
			break
		}
		lines = append(lines, body)
	}
	return map[string]string{"config.yaml": strings.Join(lines, "\n") + "\n"}
}

// domainOf and firstDescriptor are the domain of the rules and the key and
// value of their first descriptor (a value "v" when it has none).
func domainOf(t *testing.T, rules map[string]string) string {
	t.Helper()
	var r struct {
		Domain string `json:"domain"`
	}
	for _, body := range rules {
		if err := yaml.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		return r.Domain
	}
	return ""
}

func firstDescriptor(t *testing.T, rules map[string]string) []string {
	t.Helper()
	var r struct {
		Descriptors []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"descriptors"`
	}
	for _, body := range rules {
		if err := yaml.Unmarshal([]byte(body), &r); err != nil || len(r.Descriptors) == 0 {
			t.Fatalf("rules %q: %v", body, err)
		}
		v := r.Descriptors[0].Value
		if v == "" {
			v = "v"
		}
		return []string{r.Descriptors[0].Key, v}
	}
	return nil
}
