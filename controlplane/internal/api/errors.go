package api

import (
	"net/http"

	"github.com/sluice-proxy/sluice/controlplane/internal/httpjson"
)

// Detail is one problem in a request document (httpjson.Detail).
type Detail = httpjson.Detail

// ErrorBody is the JSON body of every error response (httpjson.ErrorBody).
type ErrorBody = httpjson.ErrorBody

// apiError is an error a handler answers with.
type apiError struct {
	status  int
	code    string
	message string
	details []Detail
}

// Error returns the message.
func (e *apiError) Error() string { return e.message }

func errf(status int, code, message string) *apiError {
	return &apiError{status: status, code: code, message: message}
}

func writeError(w http.ResponseWriter, status int, code, message string, details []Detail) {
	httpjson.WriteError(w, status, code, message, details)
}

func (e *apiError) write(w http.ResponseWriter) {
	writeError(w, e.status, e.code, e.message, e.details)
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpjson.WriteJSON(w, status, v) }

func writeRaw(w http.ResponseWriter, status int, body []byte) { httpjson.WriteRaw(w, status, body) }
