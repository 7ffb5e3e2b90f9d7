package tenants

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"wormhole/kubernetes/internal/grant"
	"wormhole/kubernetes/internal/publish"
	"wormhole/kubernetes/internal/wh"
)

func claim(uid string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{}
	c.UID = types.UID("uid-" + uid)
	c.Namespace, c.Name = "team", "claim-"+uid
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return c
}

func result(pool, device, mem string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Driver: "wormhole.dev", Pool: pool, Device: device, Request: "gpu"}
	if mem != "" {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			publish.Memory: resource.MustParse(mem), publish.Sessions: resource.MustParse("1")}
	}
	return r
}

func controller(server Server) *Controller {
	return &Controller{Driver: "wormhole.dev", Pool: publish.Pool{Name: "a", Endpoint: "unix:///run/wh/s.sock"},
		Server: server, Client: fake.NewSimpleClientset(), Namespace: "wormhole-system",
		Devices: map[string]DeviceInfo{"opencl-0": {API: "opencl", Model: "H100", MemoryBytes: 1 << 30, Sessions: 64}}}
}

func TestShareIsTheConsumedCapacityOfThisPoolOnly(t *testing.T) {
	c := controller(nil)
	s, unknown := c.shareOf(claim("1",
		resourceapi.DeviceRequestAllocationResult{Driver: "wormhole.dev", Pool: "a", Device: "opencl-0",
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
				publish.Memory: resource.MustParse("600Mi"), publish.Sessions: resource.MustParse("2")}},
		resourceapi.DeviceRequestAllocationResult{Driver: "wormhole.dev", Pool: "b", Device: "opencl-0"},
		resourceapi.DeviceRequestAllocationResult{Driver: "other.dev", Pool: "a", Device: "opencl-0"},
	))
	if unknown != "" || s == nil || s.MemoryMiB != 600 || s.Sessions != 2 || len(s.Devices) != 1 || s.Devices[0] != "H100" {
		t.Fatalf("share: %+v", s)
	}
	// Without consumable capacity, a result is the whole published device.
	s, _ = c.shareOf(claim("1", result("a", "opencl-0", "")))
	if s == nil || s.MemoryMiB != 1024 || s.Sessions != 64 {
		t.Fatalf("whole device: %+v", s)
	}
	if s, _ := c.shareOf(claim("1")); s != nil {
		t.Fatal("a claim without results here has no share")
	}
	if _, unknown := c.shareOf(claim("1", result("a", "opencl-7", "1Mi"))); unknown != "opencl-7" {
		t.Fatal("a device the server does not list is reported")
	}
}

// fakeServer is a server's tenant table.
type fakeServer struct {
	tenants map[string]wh.Tenant
	minted  int
	removed []string
}

func (f *fakeServer) Tenants(context.Context) ([]wh.Tenant, error) {
	var out []wh.Tenant
	for _, t := range f.tenants {
		out = append(out, t)
	}
	return out, nil
}

func (f *fakeServer) Add(_ context.Context, spec wh.TenantSpec) (string, error) {
	if _, ok := f.tenants[spec.Name]; ok {
		return "", fmt.Errorf("a tenant named %q exists already", spec.Name)
	}
	mem, sessions := spec.MemQuotaMiB, spec.MaxSessions
	f.tenants[spec.Name] = wh.Tenant{Name: spec.Name, AddedAtRunTime: true, MemQuotaMiB: &mem, MaxSessions: &sessions}
	f.minted++
	return fmt.Sprintf("token-%d", f.minted), nil
}

func (f *fakeServer) Remove(_ context.Context, name string) error {
	delete(f.tenants, name)
	f.removed = append(f.removed, name)
	return nil
}

func (c *Controller) pass(t *testing.T, claims []*resourceapi.ResourceClaim, secretsInCache func() []*corev1.Secret) {
	t.Helper()
	err := c.Reconcile(context.Background(),
		func(labels.Selector) ([]*resourceapi.ResourceClaim, error) { return claims, nil },
		func(labels.Selector) ([]*corev1.Secret, error) { return secretsInCache(), nil })
	if err != nil {
		t.Fatal(err)
	}
}

func (c *Controller) liveSecrets(t *testing.T) func() []*corev1.Secret {
	return func() []*corev1.Secret {
		list, err := c.Client.CoreV1().Secrets(c.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []*corev1.Secret
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
		return out
	}
}

func TestClaimsBecomeTenantsOnceAndGoWithTheirAllocation(t *testing.T) {
	server := &fakeServer{tenants: map[string]wh.Tenant{
		// Another pool's tenant on the same server, and a configured one: never touched.
		grant.TenantName("b", "uid-9"): {Name: grant.TenantName("b", "uid-9"), AddedAtRunTime: true},
		"operator":                     {Name: "operator"},
	}}
	c := controller(server)
	cl := claim("1", result("a", "opencl-0", "600Mi"))
	c.pass(t, []*resourceapi.ResourceClaim{cl}, c.liveSecrets(t))
	name := grant.TenantName("a", cl.UID)
	if server.minted != 1 || *server.tenants[name].MemQuotaMiB != 600 {
		t.Fatalf("minted %d, tenants %v", server.minted, server.tenants)
	}
	secret, err := c.Client.CoreV1().Secrets("wormhole-system").Get(context.Background(), grant.SecretName(cl.UID, "a"), metav1.GetOptions{})
	if err != nil || string(secret.Data[grant.KeyToken]) != "token-1" || string(secret.Data[grant.KeyEndpoint]) != "unix:///run/wh/s.sock" {
		t.Fatalf("grant: %v %v", secret, err)
	}
	// Passes that find everything in place change nothing, even when the informer's cache
	// has not seen the Secret yet.
	c.pass(t, []*resourceapi.ResourceClaim{cl}, c.liveSecrets(t))
	c.pass(t, []*resourceapi.ResourceClaim{cl}, func() []*corev1.Secret { return nil })
	if server.minted != 1 || len(server.removed) != 0 {
		t.Fatalf("re-minted: minted %d, removed %v", server.minted, server.removed)
	}
	// A device the server no longer lists (a driver that failed at restart) revokes nothing.
	lost := claim("1", result("a", "opencl-3", "600Mi"))
	c.pass(t, []*resourceapi.ResourceClaim{lost}, c.liveSecrets(t))
	if len(server.removed) != 0 {
		t.Fatalf("revoked for an unknown device: %v", server.removed)
	}
	// The claim reallocated with another share: a new tenant with the new quota.
	bigger := claim("1", result("a", "opencl-0", "800Mi"))
	c.pass(t, []*resourceapi.ResourceClaim{bigger}, c.liveSecrets(t))
	if server.minted != 2 || *server.tenants[name].MemQuotaMiB != 800 {
		t.Fatalf("reallocation: minted %d, tenants %v", server.minted, server.tenants)
	}
	// The claim goes: its tenant and grant go, the other pool's and the configured stay.
	c.pass(t, nil, c.liveSecrets(t))
	if _, ok := server.tenants[name]; ok {
		t.Fatal("the tenant outlived its claim")
	}
	if len(server.tenants) != 2 {
		t.Fatalf("other tenants touched: %v", server.tenants)
	}
	if left := c.liveSecrets(t)(); len(left) != 0 {
		t.Fatalf("grants left: %d", len(left))
	}
	if !strings.HasPrefix(name, "k8s-") || len(name) > 64 {
		t.Fatalf("tenant name %q", name)
	}
}
