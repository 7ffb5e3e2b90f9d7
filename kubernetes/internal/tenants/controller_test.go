package tenants

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"wormhole/kubernetes/internal/publish"
)

func claim(results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{}
	c.UID = "uid-1"
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return c
}

func TestShareIsTheConsumedCapacityOfThisPoolOnly(t *testing.T) {
	c := &Controller{Driver: "wormhole.dev", Pool: publish.Pool{Name: "a"}, Devices: map[string]DeviceInfo{
		"opencl-0": {API: "opencl", Model: "H100", MemoryBytes: 1 << 30, Sessions: 64},
	}}
	s := c.shareOf(claim(
		resourceapi.DeviceRequestAllocationResult{Driver: "wormhole.dev", Pool: "a", Device: "opencl-0",
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
				publish.Memory: resource.MustParse("600Mi"), publish.Sessions: resource.MustParse("2")}},
		resourceapi.DeviceRequestAllocationResult{Driver: "wormhole.dev", Pool: "b", Device: "opencl-0"},
		resourceapi.DeviceRequestAllocationResult{Driver: "other.dev", Pool: "a", Device: "opencl-0"},
	))
	if s == nil || s.memory != 600<<20 || s.sessions != 2 || len(s.models) != 1 || s.models[0] != "H100" {
		t.Fatalf("share: %+v", s)
	}
	// Without consumable capacity, a result is the whole published device.
	s = c.shareOf(claim(resourceapi.DeviceRequestAllocationResult{Driver: "wormhole.dev", Pool: "a", Device: "opencl-0"}))
	if s == nil || s.memory != 1<<30 || s.sessions != 64 {
		t.Fatalf("whole device: %+v", s)
	}
	if c.shareOf(claim()) != nil || c.shareOf(&resourceapi.ResourceClaim{}) != nil {
		t.Fatal("a claim without results here has no share")
	}
}
