package api

import (
	"encoding/json"
	"net/http"
)

// Detail is one problem in a request document.
type Detail struct {
	// Field is the JSON path of the offending value ("rules[2].window"); empty
	// for the document as a whole.
	Field string `json:"field"`
	// Message says what is wrong.
	Message string `json:"message"`
}

// ErrorBody is the JSON body of every error response:
// {"error": {"code": ..., "message": ..., "details": [...]}}.
type ErrorBody struct {
	Error struct {
		Code    string   `json:"code"`
		Message string   `json:"message"`
		Details []Detail `json:"details,omitempty"`
	} `json:"error"`
}

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
	var b ErrorBody
	b.Error.Code, b.Error.Message, b.Error.Details = code, message, details
	writeJSON(w, status, b)
}

func (e *apiError) write(w http.ResponseWriter) {
	writeError(w, e.status, e.code, e.message, e.details)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	writeRaw(w, status, body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
