package envoy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/sluice-proxy/sluice/envoy/ociimage"
)

// TestTheGeneratedManifestsDecodeStrictly runs what make manifests runs
// (sluice-image manifests, over image layouts made here) and decodes every
// document it writes strictly with its upstream API type, as the API server does
// with fieldValidation=Strict: the Kubernetes types (k8s.io/api), Istio's
// (istio.io/api, parseResource) and Envoy Gateway's (gateway/api/v1alpha1). A
// strategic-merge patch file decodes as the Deployment it patches. What a user
// applies, not only the templates, is checked.
func TestTheGeneratedManifestsDecodeStrictly(t *testing.T) {
	dir := t.TempDir()
	oci, dest := filepath.Join(dir, "oci"), filepath.Join(dir, "manifests")
	for i, name := range []string{ociimage.WasmName, ociimage.ControlPlaneName} {
		if err := os.MkdirAll(filepath.Join(oci, name), 0o755); err != nil {
			t.Fatal(err)
		}
		digest := "sha256:" + strings.Repeat(string(rune('a'+i)), 64)
		if err := os.WriteFile(filepath.Join(oci, name, "index.json"), []byte(`{"manifests":[{"digest":"`+digest+`"}]}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "run", "./cmd/sluice-image", "manifests", "-out", oci, "-repo", "reg.test/sluice", "-src", ".", "-dest", dest)
	cmd.Env = append(os.Environ(), "SLUICE_READ_TOKEN="+strings.Repeat("r", 64), "SLUICE_QUOTA_TOKEN="+strings.Repeat("q", 64))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sluice-image manifests: %v\n%s", err, out)
	}
	files, err := filepath.Glob(filepath.Join(dest, "*", "*.yaml"))
	if err != nil || len(files) < 8 {
		t.Fatalf("generated %v (%v)", files, err)
	}
	decoded := 0
	for _, f := range files {
		for _, d := range documents(t, f) {
			var out any
			switch d.APIVersion + " " + d.Kind {
			case "v1 ConfigMap":
				out = &corev1.ConfigMap{}
			case "v1 Secret":
				out = &corev1.Secret{}
			case "v1 Service":
				out = &corev1.Service{}
			case "apps/v1 Deployment":
				out = &appsv1.Deployment{}
			case "apps/v1 StatefulSet":
				out = &appsv1.StatefulSet{}
			case "policy/v1 PodDisruptionBudget":
				out = &policyv1.PodDisruptionBudget{}
			case "networking.k8s.io/v1 NetworkPolicy":
				out = &networkingv1.NetworkPolicy{}
			case "gateway.envoyproxy.io/v1alpha1 EnvoyExtensionPolicy":
				out = &egv1a1.EnvoyExtensionPolicy{}
			case "gateway.envoyproxy.io/v1alpha1 EnvoyPatchPolicy":
				out = &egv1a1.EnvoyPatchPolicy{}
			case "gateway.envoyproxy.io/v1alpha1 EnvoyProxy":
				out = &egv1a1.EnvoyProxy{}
			case "extensions.istio.io/v1alpha1 WasmPlugin", "networking.istio.io/v1 ServiceEntry",
				"networking.istio.io/v1 DestinationRule", "security.istio.io/v1 PeerAuthentication":
				parseResource(t, d.Name, d.Doc)
				decoded++
				continue
			case " ":
				if !strings.HasSuffix(f, ".patch.yaml") {
					t.Errorf("%s: no apiVersion and kind", d.Name)
					continue
				}
				out = &appsv1.Deployment{} // a strategic-merge patch of the gateway's Deployment
			default:
				t.Errorf("%s: %s %s is not checked against an API type", d.Name, d.APIVersion, d.Kind)
				continue
			}
			decodeStrict(t, d.Name, d.Doc, out)
			decoded++
		}
	}
	if decoded < 15 {
		t.Fatalf("decoded %d documents", decoded)
	}
	t.Logf("%d documents of %d generated files decode strictly", decoded, len(files))
}
