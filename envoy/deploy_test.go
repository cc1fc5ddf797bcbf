package envoy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/google/go-containerregistry/pkg/name"
	"google.golang.org/protobuf/encoding/protojson"
	extv1alpha1 "istio.io/api/extensions/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/envoy/ociimage"
	"github.com/sluice-proxy/sluice/shared/rules"
)

// decodeStrict decodes one YAML document into out with the upstream API
// type's JSON tags as the API server does with fieldValidation=Strict
// (sigs.k8s.io/json UnmarshalStrict): field names are case-sensitive, and
// unknown and duplicate fields are errors.
func decodeStrict(t *testing.T, name string, doc []byte, out any) {
	t.Helper()
	if err := unmarshalStrict(doc, out); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func unmarshalStrict(doc []byte, out any) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, out)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// documents splits a multi-document YAML file and returns each document
// with its kind and apiVersion.
func documents(t *testing.T, file string) []struct {
	Name, Kind, APIVersion string
	Doc                    []byte
} {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []struct {
		Name, Kind, APIVersion string
		Doc                    []byte
	}
	for i, part := range strings.Split(string(b), "\n---\n") {
		var tm struct {
			Kind       string `json:"kind"`
			APIVersion string `json:"apiVersion"`
		}
		if err := yaml.Unmarshal([]byte(part), &tm); err != nil {
			t.Fatalf("%s[%d]: %v", file, i, err)
		}
		out = append(out, struct {
			Name, Kind, APIVersion string
			Doc                    []byte
		}{fmt.Sprintf("%s[%d] %s", file, i, tm.Kind), tm.Kind, tm.APIVersion, []byte(part)})
	}
	return out
}

var digestRef = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)

// checkImageRef fails unless ref is <registry>/<path>/<image>@sha256:<64
// hex>, image being the name `make image` gives the layout.
func checkImageRef(t *testing.T, where, ref, image string) {
	t.Helper()
	d, err := name.NewDigest(ref)
	if err != nil {
		t.Errorf("%s: image %q: %v", where, ref, err)
		return
	}
	if !strings.HasSuffix(d.Context().RepositoryStr(), "/"+image) || !digestRef.MatchString(ref) {
		t.Errorf("%s: image %q: want <repo>/%s@sha256:<digest>, as make push prints", where, ref, image)
	}
}

// TestKubernetesControlPlane decodes envoy/kubernetes/controlplane.yaml
// with the k8s.io/api types (unknown fields fail) and checks that it is
// production-shaped: two replicas, probes on /readyz and /healthz of the
// control plane's port, requests and limits, a locked-down security
// context, the three tokens from a Secret, Redis from the ConfigMap, a
// PodDisruptionBudget and a Service selecting the pods, and the image
// `make image` names, pinned by digest.
func TestKubernetesControlPlane(t *testing.T) {
	var dep *appsv1.Deployment
	var svc *corev1.Service
	var pdb *policyv1.PodDisruptionBudget
	var np *networkingv1.NetworkPolicy
	cms := map[string]*corev1.ConfigMap{}
	for _, d := range documents(t, "kubernetes/controlplane.yaml") {
		var out any
		switch d.APIVersion + " " + d.Kind {
		case "networking.k8s.io/v1 NetworkPolicy":
			np = &networkingv1.NetworkPolicy{}
			out = np
		case "apps/v1 Deployment":
			dep = &appsv1.Deployment{}
			out = dep
		case "v1 Service":
			svc = &corev1.Service{}
			out = svc
		case "policy/v1 PodDisruptionBudget":
			pdb = &policyv1.PodDisruptionBudget{}
			out = pdb
		case "v1 ConfigMap":
			m := &corev1.ConfigMap{}
			decodeStrict(t, d.Name, d.Doc, m)
			cms[m.Name] = m
			continue
		default:
			t.Fatalf("%s: unexpected %s %s", d.Name, d.APIVersion, d.Kind)
		}
		decodeStrict(t, d.Name, d.Doc, out)
	}
	cm, boot := cms["sluice-controlplane"], cms["sluice-bootstrap-policy"]
	if dep == nil || svc == nil || pdb == nil || np == nil || cm == nil || boot == nil {
		t.Fatalf("want a Deployment, Service, PodDisruptionBudget, NetworkPolicy and the ConfigMaps sluice-controlplane and sluice-bootstrap-policy")
	}
	// Only the proxies' namespaces and labelled clients reach the control plane.
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != dep.Spec.Template.Labels["app.kubernetes.io/name"] ||
		len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) == 0 {
		t.Errorf("control plane NetworkPolicy %+v: want one ingress rule selecting the control plane's pods", np.Spec)
	}
	for _, peer := range np.Spec.Ingress[0].From {
		if peer.IPBlock != nil || peer.NamespaceSelector == nil || (len(peer.NamespaceSelector.MatchExpressions) == 0 && peer.PodSelector == nil) {
			t.Errorf("control plane NetworkPolicy: a peer open to any pod: %+v", peer)
		}
		// A pod label is set by whoever creates the pod: every peer names its
		// namespaces by kubernetes.io/metadata.name, which only the API server
		// sets (and only cluster admins create namespaces), so that no pod of
		// another namespace lets itself in by labelling itself.
		if !namesNamespaces(peer.NamespaceSelector) {
			t.Errorf("control plane NetworkPolicy: a peer whose namespaces any label can join: %+v", peer.NamespaceSelector)
		}
	}
	checkBootstrapPolicy(t, dep, boot)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", dep.Spec.Replicas)
	}
	pod := dep.Spec.Template
	labels := pod.Labels
	for what, sel := range map[string]map[string]string{"deployment": dep.Spec.Selector.MatchLabels,
		"service": svc.Spec.Selector, "pdb": pdb.Spec.Selector.MatchLabels} {
		if len(sel) == 0 {
			t.Errorf("%s selector empty", what)
		}
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s selector %s=%s does not select the pods (%v)", what, k, v, labels)
			}
		}
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 {
		t.Errorf("pdb minAvailable %v", pdb.Spec.MinAvailable)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	checkImageRef(t, "deployment", c.Image, ociimage.ControlPlaneName)

	port := map[string]int32{}
	for _, p := range c.Ports {
		port[p.Name] = p.ContainerPort
	}
	if port["http"] != ociimage.Port {
		t.Errorf("container port http = %d, want %d (the image's)", port["http"], ociimage.Port)
	}
	for what, pr := range map[string]*corev1.Probe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe} {
		if pr == nil || pr.HTTPGet == nil {
			t.Errorf("no httpGet probe for %s", what)
			continue
		}
		p := pr.HTTPGet.Port.IntVal
		if pr.HTTPGet.Port.StrVal != "" {
			p = port[pr.HTTPGet.Port.StrVal]
		}
		if pr.HTTPGet.Path != what || p != ociimage.Port {
			t.Errorf("probe %s: path %s port %d", what, pr.HTTPGet.Path, p)
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if c.Resources.Requests.Name(r, "").IsZero() || c.Resources.Limits.Name(r, "").IsZero() {
			t.Errorf("resources: %s request or limit missing", r)
		}
	}
	sc := c.SecurityContext
	psc := pod.Spec.SecurityContext
	if sc == nil || psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("security context: pod %+v container %+v", psc, sc)
	}
	if u := strings.Split(ociimage.User, ":")[0]; psc != nil && psc.RunAsUser != nil && fmt.Sprint(*psc.RunAsUser) != u {
		t.Errorf("runAsUser %d, the image's user is %s", *psc.RunAsUser, u)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	secret := ""
	for _, n := range []string{"SLUICE_ADMIN_TOKEN", "SLUICE_READ_TOKEN", "SLUICE_QUOTA_TOKEN"} {
		e := env[n]
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s: not from a Secret", n)
			continue
		}
		if secret != "" && e.ValueFrom.SecretKeyRef.Name != secret {
			t.Errorf("%s: from Secret %s, the others from %s", n, e.ValueFrom.SecretKeyRef.Name, secret)
		}
		secret = e.ValueFrom.SecretKeyRef.Name
	}
	if env["SLUICE_REQUIRE_IDENTITY"].Value != "true" {
		t.Error("SLUICE_REQUIRE_IDENTITY is not \"true\": the manifest could start the control plane token-only")
	}
	if r := env["SLUICE_REDIS_URL"].ValueFrom; r == nil || r.SecretKeyRef == nil || r.SecretKeyRef.Name != "sluice-redis" {
		t.Errorf("SLUICE_REDIS_URL: want it from the Secret sluice-redis (it carries the password): %+v", r)
	}
	if len(svc.Spec.Ports) != 3 || svc.Spec.Ports[0].Port != ociimage.Port || svc.Spec.Ports[1].Name != "grpc" || svc.Spec.Ports[2].Name != "metrics" ||
		env["SLUICE_GRPC_LISTEN"].Value != "0.0.0.0:"+strconv.Itoa(int(svc.Spec.Ports[1].Port)) {
		t.Errorf("service ports %+v, SLUICE_GRPC_LISTEN %q: want http on %d and grpc on the gRPC listener's port", svc.Spec.Ports, env["SLUICE_GRPC_LISTEN"].Value, ociimage.Port)
	}

	// Strictness: a misspelt field is refused.
	for _, d := range documents(t, "kubernetes/controlplane.yaml") {
		if d.Kind == "Deployment" {
			bad := bytes.Replace(d.Doc, []byte("readOnlyRootFilesystem:"), []byte("readOnlyRootFileSystem:"), 1)
			if err := unmarshalStrict(bad, &appsv1.Deployment{}); err == nil {
				t.Error("a misspelt Deployment field was accepted")
			}
		}
	}

	// The Istio WasmPlugin reaches this Service: its cluster is
	// outbound|<port>||<service>.<namespace>.svc.cluster.local.
	wantCluster := fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", svc.Spec.Ports[0].Port, svc.Name, svc.Namespace)
	wp := istioWasmPlugin(t)
	var pc struct {
		ControlPlane struct{ Cluster string } `json:"control_plane"`
	}
	b, _ := protojson.Marshal(wp.GetPluginConfig())
	if err := json.Unmarshal(b, &pc); err != nil || pc.ControlPlane.Cluster != wantCluster {
		t.Errorf("WasmPlugin control_plane.cluster %q, want %q (%v)", pc.ControlPlane.Cluster, wantCluster, err)
	}
}

// istioWasmPlugin decodes the WasmPlugin of istio/wasmplugin.yaml.
func istioWasmPlugin(t *testing.T) *extv1alpha1.WasmPlugin {
	t.Helper()
	for _, d := range documents(t, "istio/wasmplugin.yaml") {
		if d.Kind == "WasmPlugin" {
			_, spec := parseResource(t, d.Name, d.Doc)
			return spec.(*extv1alpha1.WasmPlugin)
		}
	}
	t.Fatal("no WasmPlugin in istio/wasmplugin.yaml")
	return nil
}

// TestIstioWasmPluginImage: the WasmPlugin pulls the image `make image`
// names, pinned by its manifest digest (the @sha256: reference make push
// prints).
func TestIstioWasmPluginImage(t *testing.T) {
	wp := istioWasmPlugin(t)
	ref, ok := strings.CutPrefix(wp.GetUrl(), "oci://")
	if !ok {
		t.Fatalf("url %q is not oci://", wp.GetUrl())
	}
	checkImageRef(t, "WasmPlugin url", ref, ociimage.WasmName)
}

// TestEnvoyGateway decodes envoy/gateway/sluice.yaml strictly with Envoy
// Gateway's API types (github.com/envoyproxy/gateway/api/v1alpha1): the
// EnvoyExtensionPolicy's Wasm extension pulls the image `make image`
// names by digest, fails open, and its configuration starts the real
// filter; the EnvoyPatchPolicy adds the cluster that configuration names,
// a valid Envoy Cluster (go-control-plane, strict, validated) reaching the
// control plane's Service.
func TestEnvoyGateway(t *testing.T) {
	var eep *egv1a1.EnvoyExtensionPolicy
	var epp *egv1a1.EnvoyPatchPolicy
	var ep *egv1a1.EnvoyProxy
	for _, d := range documents(t, "gateway/sluice.yaml") {
		if d.APIVersion != "gateway.envoyproxy.io/v1alpha1" {
			t.Fatalf("%s: apiVersion %s", d.Name, d.APIVersion)
		}
		switch d.Kind {
		case "EnvoyExtensionPolicy":
			eep = &egv1a1.EnvoyExtensionPolicy{}
			decodeStrict(t, d.Name, d.Doc, eep)
		case "EnvoyPatchPolicy":
			epp = &egv1a1.EnvoyPatchPolicy{}
			decodeStrict(t, d.Name, d.Doc, epp)
		case "EnvoyProxy":
			ep = &egv1a1.EnvoyProxy{}
			decodeStrict(t, d.Name, d.Doc, ep)
		default:
			t.Fatalf("%s: unexpected kind", d.Name)
		}
	}
	if eep == nil || epp == nil || ep == nil {
		t.Fatal("want an EnvoyExtensionPolicy, an EnvoyPatchPolicy and an EnvoyProxy")
	}
	if len(eep.Spec.Wasm) != 1 {
		t.Fatalf("%d wasm extensions", len(eep.Spec.Wasm))
	}
	w := eep.Spec.Wasm[0]
	if w.Code.Type != egv1a1.ImageWasmCodeSourceType || w.Code.Image == nil {
		t.Fatalf("code %+v: want an Image source", w.Code)
	}
	checkImageRef(t, "EnvoyExtensionPolicy image url", w.Code.Image.URL, ociimage.WasmName)
	if w.FailOpen == nil || !*w.FailOpen {
		t.Error("failOpen is not true")
	}
	if w.RootID == nil || *w.RootID != "sluice" || w.Config == nil {
		t.Fatalf("rootID %v config %v", w.RootID, w.Config)
	}
	startFilter(t, w.Config.Raw, nil)

	var pc struct {
		ControlPlane struct{ Cluster, Authority string } `json:"control_plane"`
	}
	if err := json.Unmarshal(w.Config.Raw, &pc); err != nil {
		t.Fatal(err)
	}
	if epp.Spec.Type != egv1a1.JSONPatchEnvoyPatchType || len(epp.Spec.JSONPatches) != 1 {
		t.Fatalf("patch policy %+v", epp.Spec)
	}
	p := epp.Spec.JSONPatches[0]
	if p.Type != egv1a1.ClusterEnvoyResourceType || p.Name != pc.ControlPlane.Cluster || p.Operation.Op != "add" ||
		(p.Operation.Path != nil && *p.Operation.Path != "") || p.Operation.Value == nil {
		t.Fatalf("patch %+v: want an add of the whole cluster %q", p, pc.ControlPlane.Cluster)
	}
	cl := &clusterv3.Cluster{}
	if err := protojson.Unmarshal(p.Operation.Value.Raw, cl); err != nil {
		t.Fatalf("patched cluster: %v", err)
	}
	if err := cl.ValidateAll(); err != nil {
		t.Fatalf("patched cluster: %v", err)
	}
	if cl.GetName() != pc.ControlPlane.Cluster {
		t.Errorf("cluster name %q, plugin uses %q", cl.GetName(), pc.ControlPlane.Cluster)
	}
	sa := cl.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if sa.GetAddress() != pc.ControlPlane.Authority || sa.GetPortValue() != ociimage.Port {
		t.Errorf("cluster endpoint %s:%d, want the control plane's Service %s:%d", sa.GetAddress(), sa.GetPortValue(), pc.ControlPlane.Authority, ociimage.Port)
	}
	// mTLS: the cluster's certificate files are in the directory the EnvoyProxy
	// mounts the proxy's certificate Secret at.
	utc := &tlsv3.UpstreamTlsContext{}
	if err := cl.GetTransportSocket().GetTypedConfig().UnmarshalTo(utc); err != nil {
		t.Fatalf("control plane cluster: no TLS transport socket: %v", err)
	}
	tc := utc.GetCommonTlsContext()
	var files []string
	for _, c := range tc.GetTlsCertificates() {
		files = append(files, c.GetCertificateChain().GetFilename(), c.GetPrivateKey().GetFilename())
	}
	files = append(files, tc.GetValidationContext().GetTrustedCa().GetFilename())
	if len(files) != 3 || len(tc.GetValidationContext().GetMatchTypedSubjectAltNames()) == 0 {
		t.Fatalf("control plane cluster TLS: files %v, SAN matchers %v", files, tc.GetValidationContext().GetMatchTypedSubjectAltNames())
	}
	mounts := ep.Spec.Provider.Kubernetes.EnvoyDeployment.Container.VolumeMounts
	vols := ep.Spec.Provider.Kubernetes.EnvoyDeployment.Pod.Volumes
	if len(mounts) != 1 || len(vols) != 1 || vols[0].Secret == nil || mounts[0].Name != vols[0].Name {
		t.Fatalf("EnvoyProxy: mounts %+v volumes %+v: want one Secret volume mounted", mounts, vols)
	}
	for _, f := range files {
		if path.Dir(f) != mounts[0].MountPath {
			t.Errorf("cluster TLS file %s is not in the mounted %s", f, mounts[0].MountPath)
		}
	}
	var pcq map[string]map[string]any
	_ = json.Unmarshal(w.Config.Raw, &pcq)
	// The certificate names the proxy to the control plane for its polls and its
	// quota calls (--client-ca-file): no token of any kind, inline or named.
	for _, k := range []string{"token", "token_env", "quota_token", "quota_token_env"} {
		if _, ok := pcq["control_plane"][k]; ok {
			t.Errorf("plugin configuration: %s beside mTLS (the certificate identifies the proxy)", k)
		}
	}
	// Strictness: a misspelt field is refused.
	bad := documents(t, "gateway/sluice.yaml")[0].Doc
	bad = bytes.Replace(bad, []byte("failOpen:"), []byte("failOpn:"), 1)
	if err := unmarshalStrict(bad, &egv1a1.EnvoyExtensionPolicy{}); err == nil {
		t.Error("a misspelt EnvoyExtensionPolicy field was accepted")
	}
}

// TestKubernetesControlPlaneMTLSPatch: the patch serving mTLS decodes strictly as a
// Deployment of the same name, sets the TLS files the control plane reads
// (--tls-cert-file, --tls-key-file, --client-ca-file) inside the directory it mounts
// the Secret at, and switches both probes to HTTPS.
func TestKubernetesControlPlaneMTLSPatch(t *testing.T) {
	docs := documents(t, "kubernetes/controlplane-mtls.yaml")
	if len(docs) != 1 || docs[0].Kind != "Deployment" {
		t.Fatalf("want one Deployment, got %d documents", len(docs))
	}
	dep := &appsv1.Deployment{}
	decodeStrict(t, docs[0].Name, docs[0].Doc, dep)
	if dep.Name != "sluice-controlplane" || dep.Namespace != "sluice" {
		t.Fatalf("patch of %s/%s, want sluice/sluice-controlplane", dep.Namespace, dep.Name)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 || pod.Containers[0].Name != "controlplane" || len(pod.Volumes) != 1 || pod.Volumes[0].Secret == nil {
		t.Fatalf("patch: containers %+v volumes %+v", pod.Containers, pod.Volumes)
	}
	c := pod.Containers[0]
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != pod.Volumes[0].Name {
		t.Fatalf("mounts %+v", c.VolumeMounts)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for _, n := range []string{"SLUICE_TLS_CERT_FILE", "SLUICE_TLS_KEY_FILE", "SLUICE_CLIENT_CA_FILE"} {
		if path.Dir(env[n]) != c.VolumeMounts[0].MountPath {
			t.Errorf("%s=%q, not in the mounted %s", n, env[n], c.VolumeMounts[0].MountPath)
		}
	}
	if len(env) != 3 {
		t.Errorf("env %v: want the three TLS files only", env)
	}
	for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s probe: want httpGet scheme HTTPS", what)
		}
	}
}

// checkBootstrapPolicy: the Deployment mounts the bootstrap ConfigMap, points
// SLUICE_BOOTSTRAP_POLICY at a key of it, and that key is a valid policy.
func checkBootstrapPolicy(t *testing.T, dep *appsv1.Deployment, boot *corev1.ConfigMap) {
	t.Helper()
	c := dep.Spec.Template.Spec.Containers[0]
	var file string
	for _, e := range c.Env {
		if e.Name == "SLUICE_BOOTSTRAP_POLICY" {
			file = e.Value
		}
	}
	var vol string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == boot.Name {
			vol = v.Name
		}
	}
	var dir string
	for _, m := range c.VolumeMounts {
		if m.Name == vol {
			dir = m.MountPath
		}
	}
	if file == "" || vol == "" || path.Dir(file) != dir {
		t.Fatalf("SLUICE_BOOTSTRAP_POLICY %q: want a file in the mounted ConfigMap %s (volume %q at %q)", file, boot.Name, vol, dir)
	}
	doc, ok := boot.Data[path.Base(file)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", boot.Name, path.Base(file))
	}
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rules.ParsePolicy(js); err != nil {
		t.Fatalf("bootstrap policy: %v", err)
	}
}

// TestRedisStatefulSet: the Redis decodes strictly and is run as an SRE would:
// pinned by digest, a password from the Secret whose url key the control plane
// reads, maxmemory below the container's limit with noeviction, the append-only
// file (everysec) on a volume, a disruption budget, and a NetworkPolicy letting
// only the control plane's pods in.
func TestRedisStatefulSet(t *testing.T) {
	var svc *corev1.Service
	var sts *appsv1.StatefulSet
	var pdb *policyv1.PodDisruptionBudget
	var np *networkingv1.NetworkPolicy
	for _, d := range documents(t, "kubernetes/redis.yaml") {
		switch d.Kind {
		case "Service":
			svc = &corev1.Service{}
			decodeStrict(t, d.Name, d.Doc, svc)
		case "StatefulSet":
			sts = &appsv1.StatefulSet{}
			decodeStrict(t, d.Name, d.Doc, sts)
		case "PodDisruptionBudget":
			pdb = &policyv1.PodDisruptionBudget{}
			decodeStrict(t, d.Name, d.Doc, pdb)
		case "NetworkPolicy":
			np = &networkingv1.NetworkPolicy{}
			decodeStrict(t, d.Name, d.Doc, np)
		default:
			t.Fatalf("%s: unexpected kind %s", d.Name, d.Kind)
		}
	}
	if svc == nil || sts == nil || pdb == nil || np == nil {
		t.Fatal("want a Service, a StatefulSet, a PodDisruptionBudget and a NetworkPolicy")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if !digestRef.MatchString(c.Image) {
		t.Errorf("redis image %q is not pinned by digest", c.Image)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--maxmemory-policy noeviction", "--appendonly yes", "--appendfsync everysec"} {
		if !strings.Contains(args, want) {
			t.Errorf("redis args %q lack %q", args, want)
		}
	}
	// The password is in no process's command line (ps shows it to every user
	// of the node): Redis reads it from a config file made from the Secret.
	if strings.Contains(args, "requirepass") || strings.Contains(args, "PASSWORD") || !strings.HasSuffix(c.Args[0], ".conf") {
		t.Errorf("redis args %q: want a config file first and no password", args)
	}
	for _, ic := range sts.Spec.Template.Spec.InitContainers {
		if a := strings.Join(append(append([]string{}, ic.Command...), ic.Args...), " "); strings.Contains(a, "$(REDIS_PASSWORD)") {
			t.Errorf("init container %s expands the password into its command line: %q", ic.Name, a)
		}
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 {
		t.Errorf("%d volume claims; want the append-only file on a volume", len(sts.Spec.VolumeClaimTemplates))
	}
	var maxmemory int64
	for i, a := range c.Args {
		if a == "--maxmemory" && i+1 < len(c.Args) {
			n, err := strconv.ParseInt(strings.TrimSuffix(c.Args[i+1], "mb"), 10, 64)
			if err != nil {
				t.Fatalf("--maxmemory %q", c.Args[i+1])
			}
			maxmemory = n << 20
		}
	}
	// An AOF rewrite forks: while it runs every page the parent writes is
	// copied, up to the whole dataset in the worst case, so the limit holds
	// twice maxmemory and some more.
	if limit := c.Resources.Limits.Memory().Value(); maxmemory == 0 || 2*maxmemory+64<<20 > limit {
		t.Errorf("maxmemory %d bytes, container limit %d: want room for a copy-on-write of the whole dataset during an AOF rewrite", maxmemory, limit)
	}
	// The scheduler places the pod by its request: at least what Redis may hold.
	if req := c.Resources.Requests.Memory().Value(); req < maxmemory {
		t.Errorf("memory request %d bytes, below maxmemory %d", req, maxmemory)
	}
	// The volume holds the append-only file and, during a rewrite, its new copy:
	// three times maxmemory at least.
	if len(sts.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("%d volume claim templates, want 1", len(sts.Spec.VolumeClaimTemplates))
	}
	if size := sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().Value(); size < 3*maxmemory {
		t.Errorf("volume of %d bytes for maxmemory %d: want at least 3 × maxmemory for an AOF rewrite", size, maxmemory)
	}
	// A Redis that stops answering is restarted; one loading its append-only file
	// still accepts connections, so the liveness probe is a TCP connect.
	if lp := c.LivenessProbe; lp == nil || lp.TCPSocket == nil {
		t.Errorf("liveness probe %+v: want a TCP connect to the Redis port", lp)
	}
	var secret string
	for _, ct := range append(append([]corev1.Container{}, sts.Spec.Template.Spec.InitContainers...), c) {
		for _, e := range ct.Env {
			if (e.Name == "REDIS_PASSWORD" || e.Name == "REDISCLI_AUTH") && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				secret = e.ValueFrom.SecretKeyRef.Name
			}
		}
	}
	var cpURL *corev1.EnvVarSource
	dep, _ := controlPlaneDeploymentAndService(t)
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "SLUICE_REDIS_URL" {
			cpURL = e.ValueFrom
		}
	}
	if secret == "" || cpURL == nil || cpURL.SecretKeyRef == nil || cpURL.SecretKeyRef.Name != secret {
		t.Errorf("the password (Secret %q) and the control plane's redis URL (%+v) are not one Secret", secret, cpURL)
	}
	// The documented Secret's URL names this Service.
	if b, _ := os.ReadFile("kubernetes/redis.yaml"); !strings.Contains(string(b), "redis://:%s@"+svc.Name+"."+svc.Namespace+".svc.cluster.local:6379") {
		t.Error("redis.yaml does not say how to make the Secret's url for this Service")
	}
	if pdb.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "redis" {
		t.Errorf("PodDisruptionBudget selects %v", pdb.Spec.Selector)
	}
	// A drain must be able to evict the one pod: a budget that demands it stays
	// up blocks kubectl drain for ever.
	if replicas := *sts.Spec.Replicas; pdb.Spec.MinAvailable != nil && int32(pdb.Spec.MinAvailable.IntValue()) >= replicas ||
		pdb.Spec.MaxUnavailable != nil && pdb.Spec.MaxUnavailable.IntValue() < 1 || pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
		t.Errorf("PodDisruptionBudget %+v of %d replicas: no eviction allowed, a drain never finishes", pdb.Spec, replicas)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].NamespaceSelector != nil ||
		np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "sluice-controlplane" {
		t.Errorf("redis NetworkPolicy %+v: want only the control plane's pods of its namespace", np.Spec.Ingress)
	}
}

// TestIstioTokensComeFromASecret: the WasmPlugin carries no token, only the names
// of the variables (token_env, quota_token_env) it copies from the gateway's
// environment (vmConfig.env, valueFrom HOST); the gateway patch sets exactly
// those variables from keys of the Secret tokens.yaml defines, in the gateway's
// namespace.
func TestIstioTokensComeFromASecret(t *testing.T) {
	wp := istioWasmPlugin(t)
	b, _ := protojson.Marshal(wp.GetPluginConfig())
	var pc struct {
		ControlPlane map[string]any `json:"control_plane"`
	}
	if err := json.Unmarshal(b, &pc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"token", "quota_token"} {
		if _, ok := pc.ControlPlane[k]; ok {
			t.Errorf("the WasmPlugin's plugin configuration carries %s inline", k)
		}
	}
	wantVars := map[string]bool{}
	for _, k := range []string{"token_env", "quota_token_env"} {
		v, _ := pc.ControlPlane[k].(string)
		if v == "" {
			t.Fatalf("the WasmPlugin names no %s", k)
		}
		wantVars[v] = true
	}
	host := map[string]bool{}
	for _, e := range wp.GetVmConfig().GetEnv() {
		if e.GetValueFrom() == extv1alpha1.EnvValueSource_HOST {
			host[e.GetName()] = true
		}
	}
	var secret corev1.Secret
	decodeStrict(t, "istio/tokens.yaml", documents(t, "istio/tokens.yaml")[0].Doc, &secret)
	if secret.Kind != "Secret" || secret.Namespace != "istio-system" {
		t.Fatalf("tokens.yaml: %s in %q, want a Secret in istio-system", secret.Kind, secret.Namespace)
	}
	var patch appsv1.Deployment
	decodeStrict(t, "istio/gateway-env.patch.yaml", documents(t, "istio/gateway-env.patch.yaml")[0].Doc, &patch)
	set := map[string]bool{}
	for _, c := range patch.Spec.Template.Spec.Containers {
		if c.Name != "istio-proxy" {
			t.Errorf("the patch sets container %q, want istio-proxy", c.Name)
		}
		for _, e := range c.Env {
			ref := e.ValueFrom.SecretKeyRef
			if e.Value != "" || ref == nil || ref.Name != secret.Name || secret.StringData[ref.Key] == "" {
				t.Errorf("the patch's %s is not a key of the Secret %s: %+v", e.Name, secret.Name, e)
			}
			set[e.Name] = true
		}
	}
	for v := range wantVars {
		if !host[v] || !set[v] {
			t.Errorf("%s: copied from the gateway %t, set on it from the Secret %t; want both", v, host[v], set[v])
		}
	}
}

// TestPrometheusScrapesWhatTheDashboardReads: the Prometheus Operator resources
// decode strictly (the fields they use, as monitoring.coreos.com/v1 spells them)
// and point at the endpoints the metrics are served on: the control plane's
// Service port and /metrics, the Istio gateway's and Envoy Gateway's Envoy
// /stats/prometheus; the control plane's pods carry the scrape annotations on the
// same port and path.
func TestPrometheusScrapesWhatTheDashboardReads(t *testing.T) {
	type endpoint struct {
		Port     string `json:"port"`
		Path     string `json:"path"`
		Interval string `json:"interval"`
	}
	type monitor struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints           []endpoint `json:"endpoints"`
			PodMetricsEndpoints []endpoint `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	got := map[string]monitor{}
	for _, d := range documents(t, "monitoring/prometheus-operator.yaml") {
		var m monitor
		decodeStrict(t, d.Name, d.Doc, &m)
		if m.APIVersion != "monitoring.coreos.com/v1" {
			t.Errorf("%s: apiVersion %s", d.Name, m.APIVersion)
		}
		got[m.Kind+" "+m.Metadata.Name] = m
	}
	dep, svc := controlPlaneDeploymentAndService(t)
	sm := got["ServiceMonitor sluice-controlplane"]
	// The metrics listener's port (TestTheControlPlaneIsScrapedOverPlainHTTPInEitherMode).
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" ||
		sm.Metadata.Namespace != svc.Namespace || sm.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != svc.Labels["app.kubernetes.io/name"] {
		t.Errorf("ServiceMonitor %+v: want the control plane Service's metrics port, /metrics", sm)
	}
	a := dep.Spec.Template.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/path"] != "/metrics" || a["prometheus.io/port"] == "" {
		t.Errorf("control plane pod annotations %v: want scrape on its metrics port, /metrics", a)
	}
	for _, name := range []string{"PodMonitor sluice-istio-gateway", "PodMonitor sluice-envoy-gateway"} {
		pm, ok := got[name]
		if !ok || len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Path != "/stats/prometheus" || len(pm.Spec.Selector.MatchLabels) == 0 {
			t.Errorf("%s: %+v, want Envoy's /stats/prometheus of selected pods", name, pm)
		}
	}
	if wp := istioWasmPlugin(t); got["PodMonitor sluice-istio-gateway"].Spec.Selector.MatchLabels["istio"] != wp.GetSelector().GetMatchLabels()["istio"] {
		t.Error("the Istio PodMonitor selects other pods than the WasmPlugin")
	}
}

// controlPlaneDeploymentAndService decodes, strictly, the Deployment and the
// Service of kubernetes/controlplane.yaml.
func controlPlaneDeploymentAndService(t *testing.T) (*appsv1.Deployment, *corev1.Service) {
	t.Helper()
	var dep *appsv1.Deployment
	var svc *corev1.Service
	for _, d := range documents(t, "kubernetes/controlplane.yaml") {
		switch d.Kind {
		case "Deployment":
			dep = &appsv1.Deployment{}
			decodeStrict(t, d.Name, d.Doc, dep)
		case "Service":
			svc = &corev1.Service{}
			decodeStrict(t, d.Name, d.Doc, svc)
		}
	}
	if dep == nil || svc == nil {
		t.Fatal("kubernetes/controlplane.yaml: want a Deployment and a Service")
	}
	return dep, svc
}

// namesNamespaces reports whether sel selects namespaces by name only: a
// kubernetes.io/metadata.name In (or =) requirement with values, nothing else.
func namesNamespaces(sel *metav1.LabelSelector) bool {
	if sel == nil || len(sel.MatchLabels) > 1 {
		return false
	}
	if v, ok := sel.MatchLabels["kubernetes.io/metadata.name"]; ok && v != "" && len(sel.MatchExpressions) == 0 {
		return true
	}
	for _, r := range sel.MatchExpressions {
		if r.Key != "kubernetes.io/metadata.name" || r.Operator != metav1.LabelSelectorOpIn || len(r.Values) == 0 {
			return false
		}
	}
	return len(sel.MatchExpressions) > 0 && len(sel.MatchLabels) == 0
}

// TestTheIstioInstallGivesTheControlPlaneASidecarAndTrustsItsXFCC applies, as
// docs/install.md says, kubernetes/controlplane.yaml and then istio/controlplane.yaml
// (a later document of the same kind and name replaces an earlier one, as kubectl
// apply does) and checks what the control plane's pods would run with: an Istio
// sidecar (the pod label Istio's injector selects on) and trust-xfcc "true" from the
// ConfigMap the Deployment reads it from. Without the sidecar the STRICT
// PeerAuthentication shuts the gateway out and the filter fails open; without
// trust-xfcc the control plane refuses to start.
func TestTheIstioInstallGivesTheControlPlaneASidecarAndTrustsItsXFCC(t *testing.T) {
	configMaps := map[string]*corev1.ConfigMap{}
	var dep *appsv1.Deployment
	for _, file := range []string{"kubernetes/controlplane.yaml", "istio/controlplane.yaml"} {
		for _, d := range documents(t, file) {
			switch d.Kind {
			case "ConfigMap":
				cm := &corev1.ConfigMap{}
				decodeStrict(t, d.Name, d.Doc, cm)
				configMaps[cm.Namespace+"/"+cm.Name] = cm
			case "Deployment":
				dep = &appsv1.Deployment{}
				decodeStrict(t, d.Name, d.Doc, dep)
			}
		}
	}
	if dep == nil {
		t.Fatal("no control-plane Deployment")
	}
	pod := dep.Spec.Template
	if pod.Labels["sidecar.istio.io/inject"] != "true" {
		t.Errorf("the control plane's pods carry no sidecar.istio.io/inject \"true\": Istio injects no sidecar, %v", pod.Labels)
	}
	var trust string
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "SLUICE_TRUST_XFCC" && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
			ref := e.ValueFrom.ConfigMapKeyRef
			if cm := configMaps[dep.Namespace+"/"+ref.Name]; cm != nil {
				trust = cm.Data[ref.Key]
			}
		}
	}
	if trust != "true" {
		t.Errorf("after the Istio install the control plane reads trust-xfcc %q, want \"true\"", trust)
	}
	// Without Istio (the base file alone) it stays "false".
	for _, d := range documents(t, "kubernetes/controlplane.yaml") {
		cm := &corev1.ConfigMap{}
		if d.Kind == "ConfigMap" {
			decodeStrict(t, d.Name, d.Doc, cm)
		}
		if v, ok := cm.Data["trust-xfcc"]; ok && v != "false" {
			t.Errorf("kubernetes/controlplane.yaml: ConfigMap %s sets trust-xfcc %q, want \"false\" without Istio", cm.Name, v)
		}
	}
}

// TestTheControlPlaneIsScrapedOverPlainHTTPInEitherMode: Prometheus scrapes the
// control plane on its metrics listener (--metrics-listen), which serves plain
// HTTP whether or not the mTLS patch makes the API HTTPS with client
// certificates: the pods' prometheus.io annotations and the ServiceMonitor name
// that port, the Service and the NetworkPolicy expose it, and the mTLS patch
// leaves it alone. The alerts' up{job=...} series then stay present in both modes.
func TestTheControlPlaneIsScrapedOverPlainHTTPInEitherMode(t *testing.T) {
	dep, svc := controlPlaneDeploymentAndService(t)
	c := dep.Spec.Template.Spec.Containers[0]
	var listen string
	for _, e := range c.Env {
		if e.Name == "SLUICE_METRICS_LISTEN" {
			listen = e.Value
		}
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("SLUICE_METRICS_LISTEN %q: %v", listen, err)
	}
	var container int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			container = p.ContainerPort
		}
	}
	if strconv.Itoa(int(container)) != port {
		t.Errorf("container port \"metrics\" %d, the metrics listener's %s", container, port)
	}
	a := dep.Spec.Template.Annotations
	if a["prometheus.io/port"] != port || a["prometheus.io/scheme"] == "https" {
		t.Errorf("scrape annotations %v: want the metrics listener's port %s over http", a, port)
	}
	found := false
	for _, p := range svc.Spec.Ports {
		found = found || p.Name == "metrics" && p.TargetPort.String() == "metrics"
	}
	if !found {
		t.Errorf("Service ports %+v: no \"metrics\" port", svc.Spec.Ports)
	}
	mon, err := os.ReadFile("monitoring/prometheus-operator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sm := strings.Split(string(mon), "\n---\n")[0]
	if !strings.Contains(sm, "kind: ServiceMonitor") || !strings.Contains(sm, "- port: metrics") || strings.Contains(sm, "scheme: https") {
		t.Errorf("the ServiceMonitor does not scrape the plain metrics port:\n%s", sm)
	}
	for _, d := range documents(t, "kubernetes/controlplane.yaml") {
		if d.Kind != "NetworkPolicy" {
			continue
		}
		np := &networkingv1.NetworkPolicy{}
		decodeStrict(t, d.Name, d.Doc, np)
		open := false
		for _, p := range np.Spec.Ingress[0].Ports {
			open = open || p.Port != nil && p.Port.String() == port
		}
		if !open {
			t.Errorf("the NetworkPolicy does not open the metrics port %s", port)
		}
	}
	// The mTLS patch changes neither (it sets the TLS files only:
	// TestKubernetesControlPlaneMTLSPatch).
	patch := documents(t, "kubernetes/controlplane-mtls.yaml")[0]
	if strings.Contains(string(patch.Doc), "prometheus.io") || strings.Contains(string(patch.Doc), "METRICS_LISTEN") {
		t.Error("the mTLS patch touches the scrape settings")
	}
}

// TestEachServicePortSaysItsProtocol: Istio and Gateway API implementations
// pick a port's protocol from its appProtocol (else its name): the REST and
// metrics ports are plain HTTP/1.1, the gRPC port (RLQS) is gRPC.
func TestEachServicePortSaysItsProtocol(t *testing.T) {
	_, svc := controlPlaneDeploymentAndService(t)
	want := map[string]string{"http": "http", "metrics": "http", "grpc": "grpc"}
	for _, p := range svc.Spec.Ports {
		got := ""
		if p.AppProtocol != nil {
			got = *p.AppProtocol
		}
		if w, ok := want[p.Name]; !ok || got != w {
			t.Errorf("Service port %s: appProtocol %q, want %q", p.Name, got, w)
		}
	}
}
