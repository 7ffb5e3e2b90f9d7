// kubelet-sim plays the kubelet's part towards a DRA kubelet plugin, for tests on machines
// where no kubelet can run: it registers the plugin the way the kubelet's plugin watcher does
// (GetInfo, NotifyRegistrationStatus on the registration socket), then sends the kubelet's own
// DRA messages (k8s.io/kubelet/pkg/apis/dra/v1) and prints the plugin's answer as JSON.
//
//	kubelet-sim -registration SOCK prepare|unprepare NAMESPACE/NAME/UID ...
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	registration := flag.String("registration", "", "the plugin's registration socket")
	flag.Parse()
	if *registration == "" || flag.NArg() < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-sim -registration SOCK prepare|unprepare NAMESPACE/NAME/UID ...")
		os.Exit(2)
	}
	if err := run(*registration, flag.Arg(0), flag.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-sim:", err)
		os.Exit(1)
	}
}

func dial(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func run(registration, verb string, names []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := dial(registration)
	if err != nil {
		return err
	}
	defer reg.Close()
	registrar := registerapi.NewRegistrationClient(reg)
	info, err := registrar.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	if info.Type != registerapi.DRAPlugin {
		return fmt.Errorf("the plugin registers as %q, not as a DRA plugin", info.Type)
	}
	if !supports(info.SupportedVersions, drapb.DRAPluginService) {
		_, _ = registrar.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "no supported DRA version"})
		return fmt.Errorf("the plugin offers %v, not %s", info.SupportedVersions, drapb.DRAPluginService)
	}
	if _, err := registrar.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		return fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	conn, err := dial(info.Endpoint)
	if err != nil {
		return err
	}
	defer conn.Close()
	var claims []*drapb.Claim
	for _, n := range names {
		parts := strings.Split(n, "/")
		if len(parts) != 3 {
			return fmt.Errorf("%q is not NAMESPACE/NAME/UID", n)
		}
		claims = append(claims, &drapb.Claim{Namespace: parts[0], Name: parts[1], Uid: parts[2]})
	}
	dra := drapb.NewDRAPluginClient(conn)
	var answer any
	switch verb {
	case "prepare":
		answer, err = dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	case "unprepare":
		answer, err = dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
	default:
		return fmt.Errorf("unknown verb %q", verb)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	out := map[string]any{"plugin": info.Name, "endpoint": info.Endpoint, "versions": info.SupportedVersions, "answer": answer}
	return json.NewEncoder(os.Stdout).Encode(out)
}

func supports(versions []string, service string) bool {
	for _, v := range versions {
		if v == service {
			return true
		}
	}
	return false
}
