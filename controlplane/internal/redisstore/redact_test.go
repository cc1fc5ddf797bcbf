package redisstore

import (
	"strings"
	"testing"
)

// TestURLErrorsHideCredentials: no error about a Redis URL carries its
// userinfo, whatever part of the URL is wrong.
func TestURLErrorsHideCredentials(t *testing.T) {
	for _, u := range []string{
		"redis://u:SECRET@127.0.0.1:notaport/0",
		"redis://:SECRET@127.0.0.1:6379/notadb",
		"redis://u:SECRET@127.0.0.1:6379/0?dial_timeout=soon",
		"redis://u:SECRET@[::1/0",
		"redis://u:SECRET@127.0.0.1:6379/0/extra",
		"rediss://u:SECR%45T@host name:6379",
		"redis://u:SECRET@host:1,redis://v:SECRET@h:notaport",
		"127.0.0.1:6379,u:SECRET@127.0.0.1:6379:1",
		"u:SECRET@127.0.0.1",
		"http://u:SECRET@127.0.0.1:6379",
	} {
		_, err := Options{URL: u, HistoryDepth: 1}.UniversalOptions()
		if err == nil {
			_, err = Open(Options{URL: u, HistoryDepth: 1})
		}
		if err == nil {
			t.Errorf("%s: accepted", u)
			continue
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "SECR%45T") {
			t.Errorf("the error for a bad Redis URL shows the password: %v", err)
		}
	}
}
