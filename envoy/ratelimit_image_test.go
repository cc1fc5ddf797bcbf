package envoy

import (
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-proxy/sluice/envoy/ociimage"
)

// controlPlaneImage is the checked-in reference make manifests pins.
const controlPlaneImage = "registry.example.com/sluice/" + ociimage.ControlPlaneName + "@sha256:0000000000000000000000000000000000000000000000000000000000000000"

// TestEnvoyGatewaysRateLimitDeploymentRunsTheControlPlaneImage decodes the
// EnvoyGateway configuration of gateway/ratelimit-image.yaml strictly with
// Envoy Gateway's API types: the rate limit Deployment's image is the control
// plane's (its /bin/ratelimit is the command Envoy Gateway gives it), and a
// Redis backend is named, without which Envoy Gateway deploys no rate limit
// service at all.
func TestEnvoyGatewaysRateLimitDeploymentRunsTheControlPlaneImage(t *testing.T) {
	docs := documents(t, "gateway/ratelimit-image.yaml")
	if len(docs) != 1 || docs[0].Kind != "ConfigMap" {
		t.Fatalf("want one ConfigMap, got %d documents", len(docs))
	}
	var cm corev1.ConfigMap
	decodeStrict(t, docs[0].Name, docs[0].Doc, &cm)
	if cm.Name != "envoy-gateway-config" || cm.Namespace != "envoy-gateway-system" {
		t.Errorf("%s/%s: Envoy Gateway reads envoy-gateway-system/envoy-gateway-config", cm.Namespace, cm.Name)
	}
	var eg egv1a1.EnvoyGateway
	decodeStrict(t, "envoy-gateway.yaml", []byte(cm.Data["envoy-gateway.yaml"]), &eg)
	if eg.Kind != "EnvoyGateway" || eg.APIVersion != "gateway.envoyproxy.io/v1alpha1" {
		t.Errorf("kind %s %s", eg.APIVersion, eg.Kind)
	}
	p := eg.Provider
	if p == nil || p.Kubernetes == nil || p.Kubernetes.RateLimitDeployment == nil || p.Kubernetes.RateLimitDeployment.Container == nil ||
		p.Kubernetes.RateLimitDeployment.Container.Image == nil || *p.Kubernetes.RateLimitDeployment.Container.Image != controlPlaneImage {
		t.Fatalf("provider.kubernetes.rateLimitDeployment.container.image is not %s", controlPlaneImage)
	}
	if eg.RateLimit == nil || eg.RateLimit.Backend.Type != egv1a1.RedisBackendType || eg.RateLimit.Backend.Redis == nil ||
		eg.RateLimit.Backend.Redis.URL == "" {
		t.Errorf("rateLimit.backend: %+v", eg.RateLimit)
	}
}

// TestTheImagePatchesChangeOnlyTheRatelimitContainersImage decodes the
// Istio and Contour patches strictly as Deployments: each names the guide's
// Deployment and its "ratelimit" container, and sets the image and nothing
// else (testenv/suites/rlsdeploy applies them to the guides' own manifests).
func TestTheImagePatchesChangeOnlyTheRatelimitContainersImage(t *testing.T) {
	for file, ns := range map[string]string{"istio/ratelimit-image.patch.yaml": "", "contour/ratelimit-image.patch.yaml": "projectcontour"} {
		docs := documents(t, file)
		if len(docs) != 1 {
			t.Fatalf("%s: %d documents", file, len(docs))
		}
		var d appsv1.Deployment
		decodeStrict(t, file, docs[0].Doc, &d)
		cs := d.Spec.Template.Spec.Containers
		if d.Name != "ratelimit" || d.Namespace != ns || len(cs) != 1 || cs[0].Name != "ratelimit" || cs[0].Image != controlPlaneImage {
			t.Fatalf("%s: %s/%s containers %+v", file, d.Namespace, d.Name, cs)
		}
		cs[0].Image, cs[0].Name = "", ""
		if !strings.HasPrefix(strings.TrimSpace(string(docs[0].Doc)), "#") || cs[0].String() != (&corev1.Container{}).String() {
			t.Errorf("%s sets more than the image: %+v", file, cs[0])
		}
	}
}
