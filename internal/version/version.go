// Package version says which build of lanes-exporter is running: the
// module version and VCS revision Go stamps into the binary, or what the
// release build sets with -ldflags "-X .../internal/version.version=v1.2.3".
package version

import (
	"runtime"
	"runtime/debug"
)

// version is set by release builds; otherwise the module's version is used.
var version = ""

// Info is a build's identity.
type Info struct {
	Version   string // v1.2.3, or "devel"
	Revision  string // VCS revision, or "unknown"
	GoVersion string
}

// Get returns this build's identity.
func Get() Info {
	i := Info{Version: version, Revision: "unknown", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				i.Revision = s.Value
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}
