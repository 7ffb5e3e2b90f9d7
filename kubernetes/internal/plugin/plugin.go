// Package plugin is the node side of the driver, called by the kubelet (NodePrepareResources)
// before a pod's containers start: for each share of a Wormhole server the pod's claim was
// allocated, it fetches the token the controller minted, writes it to a file on the node, and
// describes to the container runtime (as a CDI device) what the container gets: the token
// file, where to connect, the OpenCL client library registered as an ICD, and Wormhole's
// libcuda.so.1 and libnvidia-ml.so.1 where CUDA programs look for NVIDIA's.
package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"wormhole/kubernetes/internal/grant"
)

// CDIKind is the vendor/class of the CDI devices this plugin describes.
const CDIKind = "wormhole.dev/client"

// Where things appear inside a container.
const (
	containerLib = "/usr/lib/wormhole/libwormhole_opencl.so"
	containerICD = "/etc/OpenCL/vendors/wormhole.icd"
	containerDir = "/run/wormhole"
)

// containerSystemLibDir is where a container finds Wormhole's libcuda.so.1 and
// libnvidia-ml.so.1: the directory the dynamic linker searches by default on the Debian and
// Ubuntu bases CUDA images are built on, where NVIDIA's container toolkit puts the real
// libraries (so programs, and the runtimes that dlopen them by soname, need no setting).
func containerSystemLibDir() string {
	if runtime.GOARCH == "arm64" {
		return "/usr/lib/aarch64-linux-gnu"
	}
	return "/usr/lib/x86_64-linux-gnu"
}

// Plugin implements kubeletplugin.DRAPlugin.
type Plugin struct {
	Driver string
	Client kubernetes.Interface
	// Namespace holds the grants (the driver's own: a claim's users cannot edit them).
	Namespace string
	// CDIDir is where the container runtime reads CDI specs (/var/run/cdi).
	CDIDir string
	// StateDir keeps the claims' token files (root only).
	StateDir string
	// ClientLib is the node's copy of libwormhole_opencl.so.
	ClientLib string
	// CUDALib and NVMLLib are the node's copies of libwormhole_cuda.so and
	// libwormhole_nvml.so; empty (or missing at Setup): containers get OpenCL only.
	CUDALib string
	NVMLLib string
}

var _ kubeletplugin.DRAPlugin = (*Plugin)(nil)

// Setup makes the plugin's directories and the ICD file every container mounts.
func (p *Plugin) Setup() error {
	for _, d := range []*string{&p.StateDir, &p.CDIDir} {
		abs, err := filepath.Abs(*d)
		if err != nil {
			return err
		}
		*d = abs
	}
	for _, d := range []string{p.StateDir, p.CDIDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := os.Chmod(p.StateDir, 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(p.ClientLib); err != nil {
		return fmt.Errorf("the client library: %w", err)
	}
	for _, lib := range []*string{&p.CUDALib, &p.NVMLLib} {
		if *lib == "" {
			continue
		}
		if _, err := os.Stat(*lib); err != nil {
			klog.Background().Info("A stand-in library is missing: containers get no CUDA forwarding through it", "library", *lib, "err", err)
			*lib = ""
		}
	}
	return writeFile(filepath.Join(p.StateDir, "wormhole.icd"), []byte(containerLib+"\n"), 0o444)
}

// PrepareResourceClaims hands each claim's containers its tokens.
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := p.prepare(ctx, claim)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Preparing claim failed", "claim", klog.KObj(claim))
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devices}
	}
	return result, nil
}

func (p *Plugin) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	spec := cdispec.Spec{Version: "0.6.0", Kind: CDIKind}
	var devices []kubeletplugin.Device
	pools := map[string]bool{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == p.Driver {
			pools[r.Pool] = true
		}
	}
	// A process talks to one server: shares of two would hand it two tokens and endpoints
	// under the same variables.
	if len(pools) > 1 {
		return nil, fmt.Errorf("claim %s/%s has shares of %d Wormhole servers; a claim may use one (split it into one claim per server)", claim.Namespace, claim.Name, len(pools))
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != p.Driver {
			continue
		}
		name := fmt.Sprintf("%s-%s", claim.UID, r.Pool)
		if !hasDevice(spec, name) {
			edits, err := p.grant(ctx, claim, r.Pool)
			if err != nil {
				return nil, err
			}
			spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: edits})
		}
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			ShareID:      r.ShareID,
			CDIDeviceIDs: []string{CDIKind + "=" + name},
		})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := writeFile(p.specFile(claim.UID), data, 0o600); err != nil {
		return nil, fmt.Errorf("cannot write the CDI spec: %w", err)
	}
	return devices, nil
}

// grant writes the claim's token for one pool to the node and says what the container gets.
func (p *Plugin) grant(ctx context.Context, claim *resourceapi.ResourceClaim, pool string) (cdispec.ContainerEdits, error) {
	var edits cdispec.ContainerEdits
	secret, err := p.Client.CoreV1().Secrets(p.Namespace).Get(ctx, grant.SecretName(claim.UID, pool), metav1.GetOptions{})
	if err != nil {
		// The controller mints right after allocation; the kubelet asks again.
		return edits, fmt.Errorf("no token for claim %s/%s on pool %s yet: %w", claim.Namespace, claim.Name, pool, err)
	}
	if string(secret.Data[grant.KeyPool]) != pool {
		return edits, fmt.Errorf("the Secret %s/%s is not the grant of pool %s", secret.Namespace, secret.Name, pool)
	}
	if secret.Labels[grant.LabelClaimUID] != string(claim.UID) {
		return edits, fmt.Errorf("the Secret %s/%s is not the grant of claim %s", secret.Namespace, secret.Name, claim.UID)
	}
	token := secret.Data[grant.KeyToken]
	endpoint := string(secret.Data[grant.KeyEndpoint])
	if len(token) == 0 || endpoint == "" {
		return edits, fmt.Errorf("the Secret %s/%s lacks a token or an endpoint", secret.Namespace, secret.Name)
	}
	dir := filepath.Join(p.StateDir, string(claim.UID), pool)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return edits, err
	}
	// Readable by any user inside the container (which sees only this file, not the
	// root-only directory above it).
	tokenFile := filepath.Join(dir, "token")
	if err := writeFile(tokenFile, token, 0o444); err != nil {
		return edits, err
	}
	inside := containerDir + "/" + pool
	edits.Env = []string{"WORMHOLE_TOKEN_FILE=" + inside + "/token"}
	edits.Mounts = []*cdispec.Mount{
		{HostPath: tokenFile, ContainerPath: inside + "/token", Options: []string{"ro", "bind"}},
		{HostPath: p.ClientLib, ContainerPath: containerLib, Options: []string{"ro", "bind"}},
		{HostPath: filepath.Join(p.StateDir, "wormhole.icd"), ContainerPath: containerICD, Options: []string{"ro", "bind"}},
	}
	// Each under its soname and under the unversioned name a driver's development files add
	// (dlopen("libcuda.so"), which Numba tries first, and the -lcuda Triton links its kernel
	// launcher with while a program runs).
	for _, lib := range []struct {
		host  string
		names []string
	}{{p.CUDALib, []string{"libcuda.so.1", "libcuda.so"}}, {p.NVMLLib, []string{"libnvidia-ml.so.1", "libnvidia-ml.so"}}} {
		if lib.host == "" {
			continue
		}
		for _, name := range lib.names {
			edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: lib.host, ContainerPath: containerSystemLibDir() + "/" + name, Options: []string{"ro", "bind"}})
		}
	}
	if p.CUDALib != "" {
		// Triton asks ldconfig's cache for the driver's directory, which a library mounted
		// into the container after its image was built is not in.
		edits.Env = append(edits.Env, "TRITON_LIBCUDA_PATH="+containerSystemLibDir())
	}
	if ca := secret.Data[grant.KeyCA]; len(ca) > 0 {
		caFile := filepath.Join(dir, "ca.pem")
		if err := writeFile(caFile, ca, 0o444); err != nil {
			return edits, err
		}
		edits.Env = append(edits.Env, "WORMHOLE_CA="+inside+"/ca.pem")
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: caFile, ContainerPath: inside + "/ca.pem", Options: []string{"ro", "bind"}})
	}
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		socket := filepath.Clean(strings.TrimPrefix(endpoint, "unix://"))
		dir := filepath.Dir(socket)
		// The socket's directory is mounted into the container: it must hold nothing else of
		// ours (tokens), and the container must not be able to replace the socket.
		if !filepath.IsAbs(socket) || within(p.StateDir, dir) || within(p.CDIDir, dir) {
			return edits, fmt.Errorf("the server's socket %s is not in a directory of its own (the plugin keeps %s and %s): give the server a socket directory of its own", socket, p.StateDir, p.CDIDir)
		}
		edits.Env = append(edits.Env, "WORMHOLE_SOCKET="+socket)
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: dir, ContainerPath: dir, Options: []string{"rbind", "ro"}})
	case strings.HasPrefix(endpoint, "tcp://"), strings.HasPrefix(endpoint, "tls://"):
		edits.Env = append(edits.Env, "WORMHOLE_SERVER="+endpoint)
	default:
		return edits, fmt.Errorf("the Secret %s/%s names an endpoint of no known transport: %q", secret.Namespace, secret.Name, endpoint)
	}
	return edits, nil
}

// UnprepareResourceClaims removes what PrepareResourceClaims wrote (the tenant itself is the
// controller's to revoke, when the claim is deallocated).
func (p *Plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.RemoveAll(filepath.Join(p.StateDir, string(claim.UID)))
		if rmErr := os.Remove(p.specFile(claim.UID)); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			err = errors.Join(err, rmErr)
		}
		result[claim.UID] = err
	}
	return result, nil
}

// HandleError logs what went wrong in the background (publishing slices): the helper retries.
func (p *Plugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// WatchHealthStatus: a server's health is its own (clients see its errors); none is reported.
func (p *Plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (p *Plugin) specFile(claim types.UID) string {
	return filepath.Join(p.CDIDir, fmt.Sprintf("wormhole.dev-%s.json", claim))
}

// within says whether path is dir or lies under it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func hasDevice(spec cdispec.Spec, name string) bool {
	for _, d := range spec.Devices {
		if d.Name == name {
			return true
		}
	}
	return false
}

// writeFile replaces name atomically: a runtime reading the spec never sees half of it.
func writeFile(name string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), name)
}
